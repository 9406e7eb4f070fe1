"""``python -m sage_pipeline.sleep``: the project's SAGE skills root, from the command line.

    python -m sage_pipeline.sleep status                       the live version, its skills' shas, the last night
    python -m sage_pipeline.sleep versions [--skill ID]        every version made live (and the staged ones)
    python -m sage_pipeline.sleep diff [--from V] [--to V]     per-skill diff (default: the live version's parent
                                                               to the live version)
    python -m sage_pipeline.sleep rollback SKILL [--to V]      a new live version with SKILL's text from V (default:
                                                               SKILL as it was before its last change)
    python -m sage_pipeline.sleep night --date YYYY-MM-DD      one night (``run_sage_skills``) with the config

``SKILL`` is a skill id (``discipline/test-driven-development/SKILL.md``) or its folder name
(``test-driven-development``); ``V`` a version id, a unique prefix (4 or more digits), ``v<seq>`` or ``live``.
Every command takes ``--root`` (default: the config's ``skills_root`` under the artifact root, ``--data-dir``,
else ``$SAGE_DATA_DIR``, else ``./datasets``); every command but ``night`` refuses a folder that is not a SAGE
skills root (no ``live.json``) instead of creating one. ``night`` reads the same config as the Dagster asset
(``SageSkillsSettings``: ``--config FILE`` a JSON or YAML of it; ``--backend``, ``--model``, ``--host``,
``--base-url``, ``--decisions`` override single fields).

Exit status: 0 done, 1 the night ended in an error status, 2 bad usage or input (the message says what).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from sage_pipeline import artifacts, markdown


class CliError(ValueError):
    """Bad input: the message says what and what to do."""


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give seconds, e.g. --timeout 120") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the deadline must be a positive number of seconds, "
                                         "e.g. --timeout 120")
    return value


def _settings(args):
    from sage_pipeline.sleep.sage_night import SageSkillsSettings

    data = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise CliError(f"--config {path}: cannot be read ({e.strerror})") from None
        try:
            import yaml

            data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (ValueError, yaml.YAMLError) as e:
            raise CliError(f"--config {path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'} "
                           f"({e})") from None
        if not isinstance(data, dict):
            raise CliError(f"--config {path}: must hold an object of SageSkillsSettings' fields")
    s = SageSkillsSettings.model_validate(data)
    over: dict = {}
    if getattr(args, "backend", None):
        over["backend"] = args.backend
    client = {k: v for k, v in (("model", getattr(args, "model", None)), ("timeout_s", getattr(args, "timeout", None)),
                                ("temperature", getattr(args, "temperature", None))) if v is not None}
    backend = over.get("backend", s.backend)
    if getattr(args, "host", None) is not None:
        client["host"] = args.host
        backend = over["backend"] = "ollama" if "backend" not in over else over["backend"]
    if getattr(args, "base_url", None) is not None:
        client["base_url"] = args.base_url
        backend = over["backend"] = "openai" if "backend" not in over else over["backend"]
    if client:
        over[backend] = {**getattr(s, backend).model_dump(), **client}
    if getattr(args, "decisions", None):
        over["night"] = {**s.night.model_dump(), "decisions": args.decisions}
    return SageSkillsSettings.model_validate({**s.model_dump(), **over}) if over else s


def _folder(args) -> Path:
    if args.root:
        return Path(args.root)
    return _settings(args).root_path(artifacts.data_dir(args.data_dir))


def _root(args):
    """The skills root ``--root`` names, never created here."""
    from sage_pipeline.sleep.sage_skills import LIVE_FILE, SageSkillsRoot

    folder = _folder(args)
    if not (folder / LIVE_FILE).is_file():
        what = "does not exist" if not folder.exists() else (
            "is not a folder" if not folder.is_dir() else f"has no {LIVE_FILE}")
        raise CliError(f"{folder} is not a SAGE skills root: it {what}. Give --root the folder a night created "
                       "(sleep/sage_skills under the artifact root), or run `python -m sage_pipeline.sleep night` "
                       "to create it")
    return SageSkillsRoot(folder)


def skill_id(text: str) -> str:
    """A skill id from its id or its folder name (``test-driven-development``), case ignored."""
    from sage_pipeline.sage import skills as sk

    t = text.strip().strip("/")
    by_id = {s.lower(): s for s in sk.SKILL_IDS}
    if t.lower() in by_id:
        return by_id[t.lower()]
    hits = [s for s in sk.SKILL_IDS if s.split("/")[-2].lower() == t.lower()]
    if len(hits) == 1:
        return hits[0]
    raise CliError(f"skill {text!r} is not one of SAGE's skills; give one of: "
                   + ", ".join(s.split("/")[-2] for s in sk.SKILL_IDS)
                   + f" (or the full id, e.g. {sk.SKILL_IDS[0]})")


def cmd_status(args) -> int:
    root = _root(args)
    note = root.recover()
    entries = root.versions()
    live = root.live()
    e = next(x for x in reversed(entries) if x.version == live)
    print(f"skills root {root.folder}\nlive: v{e.seq}={live} ({e.action}, {e.created_at})\n"
          f"deploy: export SAGE_SKILLS_ROOT={root.live_path()}")
    if note:
        print(note)
    print(markdown.table([{"skill": sid, "sha16": h} for sid, h in root.shas(live).items()]))
    nights = sorted((root.folder / "nights").glob("*/*/diagnostics.json"))
    if nights:
        last = nights[-1]
        try:
            d = json.loads(last.read_text(encoding="utf-8"))
            print(f"last night: {d.get('date')} ({d.get('role')}): {d.get('status')}: {str(d.get('reason'))[:300]}")
        except (OSError, ValueError) as err:
            print(f"last night: {last} cannot be read ({err})")
    print(f"{len(entries)} version(s) made live, {len(root.staged())} staged")
    return 0


def cmd_versions(args) -> int:
    root = _root(args)
    sid = skill_id(args.skill) if args.skill else None
    live = root.live()
    rows = [{"seq": f"v{v.seq}", "version": v.version, "live": v.version == live, "action": v.action,
             "created": v.created_at, "changed": ", ".join(c.split("/")[-2] for c in v.changed) or "-",
             "reason": v.reason[:80]}
            for v in root.versions() if sid is None or sid in v.changed or v.action == "initial"]
    print(markdown.table(rows))
    staged = root.staged()
    if staged:
        print("\nstaged (committed, never live; the ledger's online arms): "
              + ", ".join(f"{v.version} ({v.reason[:50]})" for v in staged[-5:]))
    return 0


def cmd_diff(args) -> int:
    root = _root(args)
    b = root.find(args.to or "live")
    if args.frm:
        a = root.find(args.frm)
    else:
        e = next((x for x in reversed(root.versions()) if x.version == b), None)
        if e is None or not e.parent:
            raise CliError(f"version {b} has no parent in the history: give --from")
        a = e.parent
    d = root.diff(a, b)
    print("".join(d.values()) if d else f"versions {a} and {b} hold the same skills")
    return 0


def previous_text_version(root, sid: str) -> str:
    """The latest version made live before the live one whose ``sid`` differs from the live text."""
    live = root.live()
    now = root.texts(live)[sid]
    for e in reversed(root.versions()):
        if e.version != live and root.texts(e.version)[sid] != now:
            return e.version
    raise CliError(f"skill {sid} has never changed in {root.folder}: there is nothing to roll it back to")


def cmd_rollback(args) -> int:
    root = _root(args)
    sid = skill_id(args.skill)
    before = root.live()
    to = root.find(args.to) if args.to else previous_text_version(root, sid)
    v = root.rollback(sid, to, args.note or "")
    if v.version == before:
        print(f"{sid} in version {to} is the live text already: nothing changed (live v{v.seq}={v.version})")
        return 0
    print(f"{sid}: rolled back to its text in {to}; live now v{v.seq}={v.version} (was {before}); "
          f"undo with: python -m sage_pipeline.sleep --root {root.folder} rollback {sid} --to {before}")
    return 0


def cmd_night(args) -> int:
    from datetime import UTC, datetime, timedelta

    from sage_pipeline.sleep.sage_night import ERROR_STATUSES, run_sage_skills

    try:
        day = datetime.strptime(args.date, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise CliError(f"--date {args.date!r}: give the night's day as YYYY-MM-DD") from None
    s = _settings(args)
    data = artifacts.data_dir(args.data_dir)
    if args.root:
        folder = Path(args.root)
        foreign = folder.is_dir() and any(folder.iterdir()) and not (folder / "live.json").is_file()
        if folder.exists() and (not folder.is_dir() or foreign):
            raise CliError(f"{folder} is not a SAGE skills root (no live.json) and not an empty folder: give --root a "
                           "skills root or a new folder")
        s = type(s).model_validate({**s.model_dump(), "skills_root": str(folder.resolve())})
    o = run_sage_skills(data, args.date, (day, day + timedelta(days=1)), s, log=lambda m: print(m, file=sys.stderr))
    print(o.message)
    if o.live:
        print(f"live: v{o.live['seq']}={o.live['version']}; deploy: export SAGE_SKILLS_ROOT={o.live['path']}")
    if o.night is not None:
        print(f"diagnostics: {o.night.diagnostics}")
    return 1 if o.night is not None and o.night.status in ERROR_STATUSES else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sage_pipeline.sleep", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="artifact root (default: $SAGE_DATA_DIR or ./datasets)")
    p.add_argument("--root", default=None, help="the SAGE skills root (default: the config's skills_root under the "
                   "artifact root)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status", help="the live version, its skills' shas, the last night")
    v = sub.add_parser("versions", help="every version made live, and the staged ones")
    v.add_argument("--skill", default=None, help="only versions that changed this skill")
    d = sub.add_parser("diff", help="per-skill diff between two versions")
    d.add_argument("--from", dest="frm", default=None, help="default: the --to version's parent")
    d.add_argument("--to", default=None, help="default: live")
    rb = sub.add_parser("rollback", help="a new live version with one skill's text from an earlier version")
    rb.add_argument("skill", help="skill id or folder name")
    rb.add_argument("--to", default=None, help="version to take the text from (default: the skill before its last "
                    "change)")
    rb.add_argument("--note", default="", help="why (recorded in the history)")
    n = sub.add_parser("night", help="run one night (harvest, online check, the night) with the config")
    n.add_argument("--date", required=True, help="YYYY-MM-DD: the night's day (its runs are harvested)")
    n.add_argument("--config", default=None, help="a JSON or YAML file of SageSkillsSettings (the asset's config)")
    n.add_argument("--backend", choices=("ollama", "openai"), default=None, help="the client (default: the config's)")
    n.add_argument("--model", default=None, help="the model (default: the config's, else $SAGE_SLEEP_MODEL)")
    n.add_argument("--host", default=None, help="Ollama's host as $OLLAMA_HOST writes it (implies --backend ollama)")
    n.add_argument("--base-url", default=None, help="an OpenAI-compatible base URL ending in /v1 (implies --backend "
                   "openai)")
    n.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS", help="one attempt's deadline")
    n.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    n.add_argument("--decisions", choices=("ledger", "per_night"), default=None, help="who decides (default: ledger)")
    args = p.parse_args(argv)
    from pydantic import ValidationError

    from sage_pipeline.sage.skills import SkillsError
    from sage_pipeline.sleep.sage_night import SageNightError

    handlers = {"status": cmd_status, "versions": cmd_versions, "diff": cmd_diff, "rollback": cmd_rollback,
                "night": cmd_night}
    try:
        return handlers[args.cmd](args)
    except (CliError, SkillsError, SageNightError, ValidationError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
