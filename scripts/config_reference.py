"""Write docs/configuration.md, the configuration reference, from the pydantic models themselves.

    python scripts/config_reference.py           # writes docs/configuration.md (make config-docs)
    python scripts/config_reference.py --check   # exit 1 when docs/configuration.md is stale

It walks ``sage_pipeline.definitions.defs``: every asset whose op takes a ``config`` (a ``dg.Config``
class, which inherits the core pydantic configs section by section) and every resource. For each
config class it lists the assets using it, the op name under which run config gives it, its core
models, and per field (nested sections as dotted paths, ``a.b``; a list of sections as ``a[].b``)
the type, the default (as the definitions build it: a nested section's defaults are those of its
parent's default section; a bound resource's are its values), the constraints (pydantic's bounds,
``Literal`` choices in the type, the models' field validators) and the description; then the
checks across fields (model validators). Defaults made by a factory are made in an empty
environment (a factory may read ``$SAGE_...``: the description says which), and paths inside the
package are written relative to it, so the output depends only on the code. Everything is sorted
(configs by their first asset, fields by path), so the same code gives the same bytes.

``sage_pipeline_tests/test_config_reference.py`` renders it in memory and fails with
``docs/configuration.md is stale: run make config-docs`` when the file differs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import inspect
import json
import os
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path, PurePath

import annotated_types as at
import dagster as dg
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "configuration.md"
STALE = "docs/configuration.md is stale: run make config-docs"
REQUIRED = "required"


class ConfigReferenceError(Exception):
    """The definitions hold a config the reference cannot document (the message names where and why)."""


@dataclasses.dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    constraints: str
    description: str


@dataclasses.dataclass
class Entry:
    """One config class and who uses it: assets (key, group, op name) or a resource key."""

    cls: type[BaseModel]
    instance: BaseModel | None = None  # a bound resource: its values are the defaults
    assets: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    resource_key: str | None = None

    @property
    def sort_key(self) -> tuple:
        first = min(a[0] for a in self.assets) if self.assets else ""
        return (self.resource_key or "", first, _qualname(self.cls))


# ----------------------------------------------------------------------------- the walk
def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _where(fn) -> str:
    try:
        return f"{Path(inspect.getsourcefile(fn) or '?').as_posix()}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _labels(assets_def: dg.AssetsDefinition) -> list[str]:
    """The asset keys an op materializes, or for an op of asset checks only, its checks."""
    if assets_def.keys:
        return sorted(k.to_user_string() for k in assets_def.keys)
    return sorted(f"check {c.name} on {c.asset_key.to_user_string()}" for c in assets_def.check_keys)


def _config_class(assets_def: dg.AssetsDefinition) -> type[BaseModel] | None:
    """The ``dg.Config`` class the asset's op takes as ``config`` (Dagster's rule: the parameter named
    config), None when it takes none; an error for a config that is not a pydantic Config class."""
    key = ", ".join(_labels(assets_def))
    op = assets_def.node_def
    if not isinstance(op, dg.OpDefinition):
        raise ConfigReferenceError(f"asset {key}: backed by the graph {op.name}, which the reference does not "
                                   "walk: give the asset one op (@dg.asset or @dg.multi_asset)")
    fn = getattr(op.compute_fn, "decorated_fn", op.compute_fn)
    params = inspect.signature(fn).parameters
    if "config" in params:
        hint = typing.get_type_hints(fn).get("config")
        if isinstance(hint, type) and issubclass(hint, dg.Config):
            return hint
        raise ConfigReferenceError(f"asset {key} ({_where(fn)}): its `config` parameter is {hint!r}, not a dg.Config "
                                   "class: annotate it with one (a typed pydantic config, as defs/ does)")
    field = op.config_field
    if field is not None and field.config_type.kind.name != "ANY":  # ANY: an op that takes none
        raise ConfigReferenceError(f"asset {key} ({_where(fn)}): its op {op.name} has a config_schema and no typed "
                                   "`config` parameter: declare `config: <a dg.Config subclass>` instead")
    return None


def entries(defs: dg.Definitions) -> tuple[list[Entry], list[tuple[str, str, str]]]:
    """The config classes of ``defs`` (assets' first, then resources'), and the assets that take none."""
    by_cls: dict[type, Entry] = {}
    bare: list[tuple[str, str, str]] = []
    graph = defs.resolve_asset_graph()
    for assets_def in graph.assets_defs:
        if not assets_def.is_executable:
            continue
        cls = _config_class(assets_def)
        groups = {k.to_user_string(): g for k, g in assets_def.group_names_by_key.items()}
        for label in _labels(assets_def):
            use = (label, groups.get(label, ""), assets_def.node_def.name)
            if cls is not None:
                by_cls.setdefault(cls, Entry(cls)).assets.append(use)
            elif assets_def.keys:  # checks that take no config are not listed
                bare.append(use)
    resources = []
    for rkey, res in sorted((defs.resources or {}).items()):
        if isinstance(res, BaseModel):
            resources.append(Entry(type(res), instance=res, resource_key=rkey))
    for e in by_cls.values():
        e.assets.sort()
    return sorted(by_cls.values(), key=lambda e: e.sort_key) + resources, sorted(bare)


# ----------------------------------------------------------------------------- values and types
@contextlib.contextmanager
def _empty_environ() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _package_prefix() -> str:
    import sage_pipeline

    return str(Path(sage_pipeline.__file__).resolve().parent.parent) + os.sep


def _plain(value, prefix: str):
    """``value`` as JSON-able data; paths inside the package relative to the package's parent."""
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(mode="python"), prefix)
    if isinstance(value, enum.Enum):
        return _plain(value.value, prefix)
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, str):
        return value[len(prefix):] if value.startswith(prefix) else value
    if isinstance(value, dict):
        return {str(k): _plain(v, prefix) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v, prefix) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)


def _value(value, prefix: str) -> str:
    return json.dumps(_plain(value, prefix), sort_keys=True, ensure_ascii=False)


def _field_default(field: FieldInfo):
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        with _empty_environ():
            try:
                return field.default_factory()
            except TypeError:  # a factory of the validated data
                return PydanticUndefined
    return PydanticUndefined


def _num(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def _constraints(metadata) -> list[str]:
    out = []
    for m in metadata:
        if isinstance(m, FieldInfo):
            out += _constraints(m.metadata)
        elif isinstance(m, at.Gt):
            out.append(f"> {_num(m.gt)}")
        elif isinstance(m, at.Ge):
            out.append(f"≥ {_num(m.ge)}")
        elif isinstance(m, at.Lt):
            out.append(f"< {_num(m.lt)}")
        elif isinstance(m, at.Le):
            out.append(f"≤ {_num(m.le)}")
        elif isinstance(m, at.MultipleOf):
            out.append(f"a multiple of {_num(m.multiple_of)}")
        elif isinstance(m, at.MinLen):
            out.append(f"length ≥ {m.min_length}")
        elif isinstance(m, at.MaxLen):
            out.append(f"length ≤ {m.max_length}")
        elif type(m).__name__ == "AllowInfNan":
            out.append("finite" if not m.allow_inf_nan else "inf and nan allowed")
        elif type(m).__name__ == "_PydanticGeneralMetadata":
            for k, v in sorted(vars(m).items()):
                out.append(f"matches `{v}`" if k == "pattern" else (k if v is True else f"{k}={v!r}"))
        elif type(m).__name__ == "Strict":
            out.append("strict")
        # functional validators (Before/After/Plain/WrapValidator) convert; their checks are the model's
    return out


_NONE = type(None)


def _type(t) -> tuple[str, list[str]]:
    """A type as the reference writes it, and the constraints its parts carry (list items: 'each ...')."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is _NONE:
        return "None", []
    if origin is typing.Annotated:
        base, *meta = args
        name, cons = _type(base)
        return name, cons + _constraints(meta)
    if origin is typing.Literal:
        return " | ".join(repr(_plain(a, "")) for a in args), []
    if origin in (typing.Union, types.UnionType):
        parts = [_type(a) for a in args]
        return " | ".join(p[0] for p in parts), [c for p in parts for c in p[1]]
    if origin is not None:
        parts = [_type(a) for a in args if a is not Ellipsis]
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join(p[0] for p in parts) + (", ..." if Ellipsis in args else "")
        each = "each value " if name in ("dict", "Mapping") else "each "
        cons = [each + c for p in (parts[1:] if name in ("dict", "Mapping") else parts) for c in p[1]]
        return f"{name}[{inner}]", cons
    if isinstance(t, type):
        if issubclass(t, enum.Enum):
            return " | ".join(repr(_plain(m.value, "")) for m in t), []
        return t.__name__, []
    return re.sub(r"\btyping\.", "", str(t)), []


def _sections(t) -> list[tuple[str, type[BaseModel]]]:
    """The nested config sections in a field's type: ('', Section) for X or X | None, ('[]', Section) for list[X]."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        return [("", t)]
    if origin in (typing.Union, types.UnionType):
        return [s for a in args for s in _sections(a)]
    if origin in (list, tuple, set, frozenset, typing.Sequence) and args:
        return [("[]" + m, c) for m, c in _sections(args[0])]
    if origin is typing.Annotated:
        return _sections(args[0])
    return []


def _check_text(decorator) -> str:
    """A validator as ``Class._name`` (where it is defined), and its docstring's first paragraph."""
    fn = inspect.unwrap(getattr(decorator.func, "__func__", decorator.func))
    doc = inspect.getdoc(fn)
    return f"`{fn.__qualname__}`" + (f": {_cell(doc.split(chr(10) * 2)[0])}" if doc else "")


def _field_checks(cls: type[BaseModel]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for dec in sorted(cls.__pydantic_decorators__.field_validators.values(), key=lambda d: d.cls_var_name):
        for name in dec.info.fields:
            out.setdefault(name, []).append(f"checked by {_check_text(dec)}")
    return out


def rows(cls: type[BaseModel], instance: BaseModel | None = None, path: str = "",
         prefix: str | None = None) -> tuple[list[Row], list[str]]:
    """The fields of ``cls`` (its nested sections' fields after them, as dotted paths) with their defaults:
    ``instance``'s values where there is one (a section's default, a bound resource), else the fields'.
    Also the checks across fields (``path: text``)."""
    prefix = _package_prefix() if prefix is None else prefix
    out: list[Row] = []
    checks = [f"{path.rstrip('.') or '(the whole config)'}: {_check_text(dec)}"
              for dec in sorted(cls.__pydantic_decorators__.model_validators.values(), key=lambda d: d.cls_var_name)]
    field_checks = _field_checks(cls)
    for name, field in cls.model_fields.items():
        key = field.alias or name
        default = getattr(instance, name) if instance is not None else _field_default(field)
        type_name, cons = _type(field.annotation)
        cons = cons + _constraints(field.metadata) + field_checks.get(name, []) + field_checks.get("*", [])
        sections = _sections(field.annotation)
        if default is PydanticUndefined:
            shown = REQUIRED
        elif isinstance(default, BaseModel) and sections:
            shown = "(section)"
        else:
            shown = f"`{_cell(_value(default, prefix))}`"
        out.append(Row(path + key, f"`{_cell(type_name)}`", shown, _cell("; ".join(cons)),
                       _cell(field.description or "") or "_(no description)_"))
        for mark, section in sections:
            sub = default if (mark == "" and isinstance(default, section)) else None
            sub_rows, sub_checks = rows(section, sub, f"{path}{key}{mark}.", prefix)
            out += sub_rows
            checks += sub_checks
    return out, checks


# ----------------------------------------------------------------------------- the page
def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().replace("|", "\\|")


def _doc(cls: type) -> str:
    """The class's own docstring's first paragraph, else its first core model's."""
    for c in cls.__mro__:
        doc = c.__dict__.get("__doc__")
        if doc and c.__module__.startswith("sage_pipeline"):
            return _cell(inspect.cleandoc(doc).split("\n\n")[0])
    return ""


def _cores(cls: type) -> list[str]:
    return [_qualname(c) for c in cls.__mro__[1:]
            if isinstance(c, type) and issubclass(c, BaseModel) and not issubclass(c, dg.Config)
            and c.__module__.startswith("sage_pipeline") and not c.__module__.startswith("sage_pipeline.defs")]


def _example(configs: list[Entry], prefix: str) -> str:
    """A real run config: the first asset's first top-level field with a plain default, set to that default."""
    for e in configs:
        if not e.assets:
            continue
        for name, field in e.cls.model_fields.items():
            d = _field_default(field)
            if isinstance(d, (bool, int, float, str)) and not _sections(field.annotation):
                key, _, op = e.assets[0]
                cfg = json.dumps({"ops": {op: {"config": {field.alias or name: _plain(d, prefix)}}}})
                return (f"For example (`{field.alias or name}` at its default):\n\n```sh\n"
                        f"dg launch --assets {key} --config-json '{cfg}'\n"
                        f"dagster asset materialize -m sage_pipeline.definitions --select {key} "
                        f"--config-json '{cfg}'\n```\n")
    return ""


def _table(rs: list[Row]) -> list[str]:
    lines = ["| field | type | default | constraints | description |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{r.path}` | {r.type} | {r.default} | {r.constraints} | {r.description} |"
              for r in sorted(rs, key=lambda r: r.path)]
    return lines


def render(defs: dg.Definitions) -> str:
    """The whole reference for ``defs``: the same definitions give the same text."""
    prefix = _package_prefix()
    found, bare = entries(defs)
    configs = [e for e in found if e.assets]
    resources = [e for e in found if e.resource_key]
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/config_reference.py from the pydantic models (make config-docs). "
        "Do not edit: sage_pipeline_tests/test_config_reference.py fails when this file is stale. -->",
        "",
        "Every asset's run config is a typed pydantic model: a `dg.Config` class in `sage_pipeline/defs/` that "
        "inherits the core configs it passes on, and each default is declared once, in the core. A run gives "
        "an asset's config under its op name (`ops: {<op>: {config: {...}}}`) and a resource's under "
        "`resources: {<key>: {config: {...}}}`, in a run config file (`-c run.yaml`) or as JSON "
        "(`--config-json`); a field left out keeps its default. A nested section is a mapping "
        "(`a.b` below is `a: {b: ...}`); `a[].b` is the field `b` of each item of the list `a`. "
        "Defaults are as `sage_pipeline.definitions` builds them; a default made from the environment is shown "
        "as it is with none set.",
        "",
        _example(configs, prefix),
        "## Index",
        "",
        "| asset | group | op (run config key) | config |",
        "| --- | --- | --- | --- |",
    ]
    index = sorted([(a, g, op, f"`{e.cls.__name__}`") for e in configs for a, g, op in e.assets]
                   + [(a, g, op, "none") for a, g, op in bare])
    out += [f"| `{a}` | {g} | `{op}` | {c} |" for a, g, op, c in index]
    out += ["", "## Asset configs", ""]
    for e in configs:
        names = ", ".join(f"`{a}`" for a, _, _ in e.assets)
        out += [f"### {e.cls.__name__}", "",
                f"Used by {names} (run config: " + ", ".join(f"`ops.{op}.config`" for _, _, op in e.assets) + ").",
                f"Class `{_qualname(e.cls)}`"
                + (f"; core models: {', '.join(f'`{c}`' for c in _cores(e.cls))}." if _cores(e.cls) else "."), ""]
        doc = _doc(e.cls)
        if doc:
            out += [doc, ""]
        rs, checks = rows(e.cls, None, "", prefix)
        out += _table(rs) + [""]
        if checks:
            out += ["Checks across fields:", ""] + [f"- `{c.split(': ', 1)[0]}`: {c.split(': ', 1)[1]}"
                                                    for c in sorted(checks)] + [""]
    out += ["## Resources", ""]
    for e in resources:
        users = sorted(a for c in configs for a, _, _ in c.assets if _requires(defs, a, e.resource_key))
        users += sorted(a for a, _, _ in bare if _requires(defs, a, e.resource_key))
        out += [f"### `{e.resource_key}`: {e.cls.__name__}", "",
                f"Run config: `resources.{e.resource_key}.config`. Class `{_qualname(e.cls)}`"
                + (f"; core models: {', '.join(f'`{c}`' for c in _cores(e.cls))}" if _cores(e.cls) else "")
                + f". Required by {len(users)} assets: " + ", ".join(f"`{a}`" for a in sorted(users)) + ".", ""]
        doc = _doc(e.cls)
        if doc:
            out += [doc, ""]
        rs, checks = rows(e.cls, e.instance, "", prefix)
        out += _table(rs) + [""]
        if checks:
            out += ["Checks across fields:", ""] + [f"- `{c.split(': ', 1)[0]}`: {c.split(': ', 1)[1]}"
                                                    for c in sorted(checks)] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def _requires(defs: dg.Definitions, asset: str, resource_key: str) -> bool:
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey.from_user_string(asset)
    return resource_key in graph.assets_def_for_key(key).required_resource_keys


def stale(path: Path, defs: dg.Definitions) -> str | None:
    """None when ``path`` holds what ``render(defs)`` gives, else the message saying what to run."""
    want = render(defs)
    have = path.read_text(encoding="utf-8") if path.exists() else None
    if have == want:
        return None
    return STALE + (f" ({path} does not exist)" if have is None else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale, writing nothing")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    from sage_pipeline.definitions import defs

    if args.check:
        msg = stale(args.out, defs)
        print(msg or f"{args.out} is up to date", file=sys.stderr if msg else sys.stdout)
        return 1 if msg else 0
    from sage_pipeline import artifacts

    text = render(defs)
    artifacts.write_text(args.out, text)
    found, _ = entries(defs)
    print(f"wrote {args.out}: {len(found)} configs, {text.count(chr(10))} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
