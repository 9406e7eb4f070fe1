"""Errors a user can fix: each names the file, the field and what to do.

Also the strict YAML reader of the project's configuration files (routing tables,
catalogues): :func:`load_yaml` refuses a key written twice in one mapping (PyYAML would
silently keep the last), naming file, line and key, and returns the line of every key
so that a loader can name the line of a field it does not know (:func:`check_keys`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

import yaml

# A path of keys from the document's root, e.g. ("routing", "coder", "primary").
KeyPath = tuple
# KeyPath -> the 1-based line its key is written on.
KeyLines = dict


class ConfigError(ValueError):
    """A configuration file (routing table, model catalogue, ...) is invalid."""

    def __init__(self, path: object, field: str, problem: str, fix: str = "", line: int | None = None) -> None:
        self.path, self.field, self.problem, self.line = str(path), field, problem, line
        where = f"{path}:{line}" if line else f"{path}"
        msg = f"{where}: {field}: {problem}"
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path) or "<document>"


def _walk(node: yaml.Node, path: KeyPath, source: str, lines: KeyLines) -> None:
    """Record the line of every mapping key under ``node``; refuse a key written twice."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' merges are not duplicates
                _walk(value_node, path, source, lines)
                continue
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode):
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise ConfigError(
                        source, _dotted(path + (key_node.value,)),
                        f"duplicate key {key_node.value!r} (first written on line {seen[ident]}); "
                        "YAML would silently keep only the last one",
                        "keep one and delete the other", line=line)
                seen[ident] = line
                lines.setdefault(path + (key_node.value,), line)
                _walk(value_node, path + (key_node.value,), source, lines)
            else:
                _walk(value_node, path + ("<key>",), source, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.setdefault(path + (i,), item.start_mark.line + 1)
            _walk(item, path + (i,), source, lines)


def load_yaml(path: str | Path) -> tuple[object, KeyLines]:
    """The document in ``path`` and the line of each key, or a ConfigError naming file and line.

    Refuses duplicate keys in any mapping (file, line, key and the first line). Keys are
    recorded by their YAML text, so ``lines[("routing", "coder", "primary")]`` is the line
    on which ``primary:`` of role ``coder`` is written.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
    lines: KeyLines = {}
    if node is not None:
        _walk(node, (), str(path), lines)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
    return doc, lines


def check_keys(mapping: dict, known: Iterable[str], *, source: str, path: KeyPath,
               lines: KeyLines | None, what: str) -> None:
    """Refuse a key of ``mapping`` (at ``path``) that is not in ``known``, naming file, line and key."""
    known = tuple(known)
    for key in mapping:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            source, _dotted(path + (key,)),
            f"unknown field {key!r}: {what} has only {', '.join(known)}",
            f"{hint}fix the spelling or delete the field",
            line=(lines or {}).get(path + (key,)))
