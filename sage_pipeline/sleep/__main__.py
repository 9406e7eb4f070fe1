"""``python -m sage_pipeline.sleep``: versions, rollback, show, run-night.

    python -m sage_pipeline.sleep versions --skill coder
    python -m sage_pipeline.sleep rollback --skill coder --version 147fe9dbb47b   (or a prefix, or v2)
    python -m sage_pipeline.sleep show --skill coder --version v1
    python -m sage_pipeline.sleep run-night --skill coder --date 2026-11-01 [--backend openai --model M --timeout 120]

The artifact root is ``--data-dir``, else ``$SAGE_DATA_DIR``, else ``./datasets``.
Exit status: 0 done, 1 the night ended in an error status, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import math
import sys

from sage_pipeline import artifacts, markdown


def _store(args):
    from sage_pipeline.sleep.store import SkillStore

    return SkillStore(artifacts.data_dir(args.data_dir) / "sleep", args.skill)


def cmd_versions(args) -> int:
    store = _store(args)
    entries = store.versions()
    if not entries:
        print(f"skill {args.skill!r} has no stored versions under {store.root} (no night has run yet)")
        return 0
    live = store.current() if store.skill_path.is_file() and store.memory_path.is_file() else ""
    rows = [{"seq": f"v{v.seq}", "version": v.version, "live": v.version == live and v is entries[-1],
             "action": v.action, "night": v.night or "-", "created": v.created_at, "note": v.note[:60]}
            for v in entries]
    print(markdown.table(rows))
    if live and live != entries[-1].version:
        print(f"\nthe live documents ({live}) were edited after the last recorded version")
    return 0


def cmd_rollback(args) -> int:
    store = _store(args)
    before = store.current()
    v = store.restore(args.version, note=args.note)
    print(f"skill {args.skill}: live documents now at version {v.version} (v{v.seq}), were {before}; "
          f"undo with: python -m sage_pipeline.sleep rollback --skill {args.skill} --version {before}")
    return 0


def cmd_show(args) -> int:
    store = _store(args)
    snap = store.read_version(store.find(args.version))
    print(snap.memory.decode("utf-8") if args.memory else snap.skill.decode("utf-8"), end="")
    return 0


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


def _given(**values) -> dict:
    """The options given on the command line (None: not given, so the settings' own default holds)."""
    return {k: v for k, v in values.items() if v is not None}


def cmd_run_night(args) -> int:
    from sage_pipeline.sleep.cycle import ERROR_STATUSES
    from sage_pipeline.sleep.nightly import NightSettings, day_window, run_night

    settings = NightSettings.model_validate(_given(
        backend=args.backend, sim_seed=args.seed, sandbox=args.sandbox,
        openai=_given(base_url=args.base_url, model=args.model, timeout_s=args.timeout, temperature=args.temperature),
        cycle=_given(limits=_given(edit_budget=args.edit_budget, block_max_chars=args.block_max_chars),
                     gate=_given(test=args.gate_test, alpha=args.alpha, samples=args.samples, metric=args.metric,
                                 no_regression=False if args.allow_regression else None),
                     workers=args.workers)))
    r, files = run_night(artifacts.data_dir(args.data_dir), args.skill, args.date, day_window(args.date, args.tz),
                         settings, log=lambda m: print(m, file=sys.stderr))
    print(f"{args.skill} {args.date}: {r.status} (gate {r.gate_action}): {r.reason}")
    if r.cause:
        print(f"cause: {r.cause}")
    print(f"report: {files.report}\ndiagnostics: {files.diagnostics}")
    return 1 if r.status in ERROR_STATUSES else 0


def _run_night_parser(sub) -> None:
    """run-night's options: each default (and choice) is the settings model's, named in the help."""
    from typing import get_args

    from sage_pipeline.sleep.backends import OpenAIConfig
    from sage_pipeline.sleep.block import EditLimits
    from sage_pipeline.sleep.cycle import CycleConfig
    from sage_pipeline.sleep.gate import GateConfig
    from sage_pipeline.sleep.nightly import NightSettings

    def field(model, name: str, **kw) -> dict:
        f = model.model_fields[name]
        choices = get_args(f.annotation) or None
        default = "" if f.default_factory else f" (default {f.default})"
        return {"help": f"{f.description}{default}", "choices": choices, **kw}

    rn = sub.add_parser("run-night", help="run one night for one skill")
    rn.add_argument("--skill", required=True)
    rn.add_argument("--date", required=True, help="YYYY-MM-DD: the day whose tasks are harvested")
    rn.add_argument("--tz", default="UTC", help="time zone of the day (default UTC)")
    rn.add_argument("--backend", **field(NightSettings, "backend"))
    rn.add_argument("--seed", type=int, **field(NightSettings, "sim_seed"))
    rn.add_argument("--base-url", **field(OpenAIConfig, "base_url"))
    rn.add_argument("--model", **field(OpenAIConfig, "model"))
    rn.add_argument("--timeout", type=positive_seconds, metavar="SECONDS", **field(OpenAIConfig, "timeout_s"))
    rn.add_argument("--temperature", type=float, **field(OpenAIConfig, "temperature"))
    rn.add_argument("--gate-test", **field(GateConfig, "test"))
    rn.add_argument("--alpha", type=float, **field(GateConfig, "alpha"))
    rn.add_argument("--samples", type=int, **field(GateConfig, "samples"))
    rn.add_argument("--metric", **field(GateConfig, "metric"))
    rn.add_argument("--allow-regression", action="store_true", help="do not protect single val tasks ('strict': "
                    "accept a better mean even if a val task drops; 'paired': no bound on tasks that drop)")
    rn.add_argument("--edit-budget", type=int, **field(EditLimits, "edit_budget"))
    rn.add_argument("--block-max-chars", type=int, **field(EditLimits, "block_max_chars"))
    rn.add_argument("--workers", type=int, **field(CycleConfig, "workers"))
    rn.add_argument("--sandbox", **field(NightSettings, "sandbox"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sage_pipeline.sleep", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="artifact root (default: $SAGE_DATA_DIR or ./datasets)")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("versions", help="list a skill's stored versions")
    v.add_argument("--skill", required=True)
    rb = sub.add_parser("rollback", help="make a stored version live again")
    rb.add_argument("--skill", required=True)
    rb.add_argument("--version", required=True, help="version id, a unique prefix (>= 4 characters) or v<seq>")
    rb.add_argument("--note", default="", help="why (recorded in the history)")
    sh = sub.add_parser("show", help="print a stored version's skill document (or --memory)")
    sh.add_argument("--skill", required=True)
    sh.add_argument("--version", required=True)
    sh.add_argument("--memory", action="store_true")
    _run_night_parser(sub)
    args = p.parse_args(argv)
    from sage_pipeline.sleep.store import StoreError

    handlers = {"versions": cmd_versions, "rollback": cmd_rollback, "show": cmd_show, "run-night": cmd_run_night}
    try:
        return handlers[args.cmd](args)
    except (StoreError, FileNotFoundError, ValueError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
