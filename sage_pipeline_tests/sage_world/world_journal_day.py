"""One day of SAGE's real ``sage run`` against the model world on its scaled clock, with the world's
record of every call beside SAGE's journals: what the task outcomes' reading of calls is checked
against (test_task_outcome_calls.py), and what wrote the fixture
``sage_pipeline_tests/routing/fixtures/sage_world_run`` (its README says how)::

    SAGE_PYTHON=.sage/venv/bin/python .venv/bin/python -m sage_pipeline_tests.sage_world.world_journal_day \\
        --dest sage_pipeline_tests/routing/fixtures/sage_world_run --runs 6

SAGE's table is its bundled models.yaml with the planner on qwen3:14b-q4_K_M and the test engineer
on codestral:22b (:func:`table_for_every_model`), so that every local model of the table is called;
the world's default clock (``WorldConfig.clock_scale``) paces the calls.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sage_world import harness
from sage_pipeline.sage_world.harness import DayResult, HarnessConfig, SageInstall, run_day
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, build_world

TRUTH_KEYS = ("run", "task_id", "agent", "model", "gpu_s", "usd")  # what the fixture keeps of each call record


def table_for_every_model(src: Path, dst: Path) -> Path:
    """SAGE's table with the planner on qwen3:14b-q4_K_M and the test engineer on codestral:22b: in
    `sage run` the bundled table never reaches either (the debugger always takes its fallback; the
    planner's fallback needs a complexity over 0.8), and their answers in the world do not depend on
    the model, so only the time differs. Written in SAGE's grammar by the project's table writer."""
    table = RoutingTable.load(src)
    for role, model in (("planner", "qwen3:14b-q4_K_M"), ("test_engineer", "codestral:22b")):
        table = table.with_route(role, primary=model)
    return table.write(dst)


@contextmanager
def _sage_reads(table: Path) -> Iterator[None]:
    """Every `sage run` of the harness reads ``table`` (SAGE_MODELS_YAML; the harness sets none)."""
    orig = harness.sage_env
    harness.sage_env = lambda *a, **k: {**orig(*a, **k), "SAGE_MODELS_YAML": str(table)}
    try:
        yield
    finally:
        harness.sage_env = orig


def clocked_day(sage_python: str | Path, root: Path, runs: int = 8, workers: int = 2,
                task_seed: int = 1) -> tuple[ModelWorld, DayResult, Path]:
    """``runs`` `sage run`s (the world's first tasks) on ``workers`` workspaces under ``root``:
    the world (its ``truth``: one record per call, with ``gpu_s``), the day and SAGE's table."""
    install = SageInstall.find(sage_python)
    table = table_for_every_model(install.models_yaml, root / "models.yaml")
    world = build_world(table, n_tasks=24, task_seed=task_seed, config=WorldConfig())
    with _sage_reads(table), WorldServer(world) as srv:
        day = run_day(world, srv.url, install, 1, [t.task_id for t in world.tasks[:runs]], root / "day",
                      HarnessConfig(workers=workers))
    return world, day, table


def params_b(world: ModelWorld) -> dict[str, float | None]:
    """Each model of SAGE's table -> its billions of parameters (None: an API model)."""
    models = {m for r in world.table.routes.values() for m in (r.primary, r.fallback)}
    return {m: world.time.models[world.calibrated(m)].params_b for m in sorted(models)}


def write_fixture(dest: Path, world: ModelWorld, day: DayResult, table: Path, sage_license: Path) -> None:
    """SAGE's journals of the day (``ws-<w>/memory/sessions/*.log``, verbatim), the world's call records
    (``truth.jsonl``), the runs and their SAGE sessions (``runs.jsonl``), the clock and the models'
    sizes (``world.json``), SAGE's table and licence."""
    if dest.exists():
        shutil.rmtree(dest)
    for sessions in day.sessions_dirs:
        rel = sessions.relative_to(day.root)
        (dest / rel).mkdir(parents=True)
        for f in sorted(sessions.glob("*.log")):
            shutil.copyfile(f, dest / rel / f.name)
    (dest / "truth.jsonl").write_text("".join(json.dumps({k: t.get(k) for k in TRUTH_KEYS}) + "\n"
                                              for t in world.truth))
    (dest / "runs.jsonl").write_text("".join(json.dumps({"run": r.run, "task_id": r.task_id, "worker": r.worker,
                                                         "sessions": r.sessions, "failure": r.failure}) + "\n"
                                             for r in day.runs))
    (dest / "world.json").write_text(json.dumps({
        "clock_scale": world.config.clock_scale, "params_b": params_b(world),
        "call_seconds": {f"{a}|{m}": world.call_seconds(a, m) for a, m in sorted({(t["agent"], t["model"])
                                                                                 for t in world.truth})}},
        indent=1) + "\n")
    shutil.copyfile(table, dest / "models.yaml")
    shutil.copyfile(sage_license, dest / "SAGE_LICENSE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", required=True, type=Path)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--sage-python", default=None, help="default: $SAGE_PYTHON")
    ap.add_argument("--sage-license", type=Path, default=Path(__file__).resolve().parents[2].parent / "shared" /
                    "upstream" / "sage" / "LICENSE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        world, day, table = clocked_day(args.sage_python or "", Path(tmp), runs=args.runs)
        if day.finished != len(day.runs):
            raise SystemExit(f"not every run finished: {day.failures}")
        write_fixture(args.dest, world, day, table, args.sage_license)
    print(json.dumps(day.summary()))


if __name__ == "__main__":
    main()
