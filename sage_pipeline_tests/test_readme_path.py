"""The README's path from your SAGE to a deployed bundle, run as a new user would: its bash blocks, as written,
in a fresh folder, after `make run`'s installs (this interpreter's virtualenv), on two workspaces and a goal ledger
SAGE's own `sage run` wrote (the shipped SAGE week's day 1), with SAGE's own Python for the deploy, and the model
world (the one the week was made in, built again from its manifest) as the Ollama server the sleep model is asked
on (`OLLAMA_HOST`).

Only what names the user's machine is replaced (each replacement must find its text, so a README that changes
fails here): the workspaces, the goal ledger and SAGE's Python; the sleep model's name is the README's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import dagster as dg

from sage_pipeline.sage.week import embedded_week
from sage_pipeline_tests.ui import _support as sup

SECTION = "## From your SAGE to a deployed bundle"


def readme_path_script() -> str:
    """The section's bash blocks, in order, joined."""
    text = (sup.REPO / "README.md").read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    assert len(blocks) >= 3, f"README.md, {SECTION}: expected the point, materialize and deploy blocks, got {blocks}"
    return "\n".join(blocks)


def _week_world(sage_python: str, week_root):
    """The model world the shipped week was made in (its manifest's table, pool, seed and settings), answering
    the sleep cycle's reflect too (skills mode null: no rule helps), with no clock; each of the week's runs
    assigned its task (``records/<day>/runs.jsonl``), as the harness did, so the replays of a run are answered."""
    import json

    from sage_pipeline.sage.week import load_manifest
    from sage_pipeline.sage_world.harness import SageInstall
    from sage_pipeline.sage_world.skills_world import SkillsWorldConfig
    from sage_pipeline.sage_world.world import WorldConfig, build_world

    w = load_manifest()["world"]
    config = WorldConfig(**{**w["config"], "clock_scale": 0.0})
    world = build_world(SageInstall.find(sage_python).models_yaml, n_tasks=w["tasks"], task_seed=w["seed"],
                        config=config, skills=SkillsWorldConfig(mode="null"))
    for runs in sorted(week_root.glob("records/*/runs.jsonl")):
        for line in runs.read_text().splitlines():
            r = json.loads(line)
            world.assign(r["run"], r["task_id"])
    return world


def test_the_readmes_path_to_a_deployed_bundle_runs_as_written(tmp_path, sage_python):
    week = embedded_week(tmp_path / "shipped")
    day = week.days[0]
    ws = sorted((week.workspaces / day).glob("ws-*"))
    assert len(ws) >= 2, ws
    goals = week.root / "records" / day / "goals.jsonl"
    assert goals.is_file(), goals
    script = readme_path_script()
    for old, new in {". .venv/bin/activate": f". {sys.prefix}/bin/activate", "/work/app1": str(ws[0]),
                     "/work/app2": str(ws[1]), "/work/goals.jsonl": str(goals),
                     "/path/to/sage/.venv/bin/python": sage_python}.items():
        assert old in script, f"README.md, {SECTION}: {old!r} is gone; update this test's stand-ins"
        script = script.replace(old, new)
    home = tmp_path / "user"
    (home / ".dagster_home").mkdir(parents=True)  # what make run left (DAGSTER_HOME=$PWD/.dagster_home)
    (home / ".dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    script = "set -euo pipefail\n" + script + "\nenv | grep '^SAGE_' | sort > sage_env.txt\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGE_", "DAGSTER_"))}
    env.update(HOME=str(home), DAGSTER_DISABLE_TELEMETRY="1",
               PATH=f"{sys.prefix}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}")
    from sage_pipeline.sage_world.server import WorldServer

    with WorldServer(_week_world(sage_python, week.root)) as srv:
        env["OLLAMA_HOST"] = srv.url
        proc = subprocess.run(["bash", "-c", script], cwd=home, env=env, capture_output=True, text=True,
                              timeout=1200)
    said = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-5000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, said

    exported = dict(line.split("=", 1) for line in (home / "sage_env.txt").read_text().splitlines() if "=" in line)
    for name in ("SAGE_MODELS_YAML", "SAGE_SKILLS_ROOT"):
        assert name in exported and os.path.exists(exported[name]), (name, exported, said)
    assert str(home / "sage-deploy") in exported["SAGE_MODELS_YAML"], exported
    with dg.DagsterInstance.from_config(str(home / ".dagster_home")) as instance:
        def meta(*path: str) -> dict:
            recs = instance.fetch_materializations(dg.AssetKey(list(path)), limit=1).records
            assert recs, f"{'/'.join(path)} was never materialized\n{said}"
            return {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}

        data = meta("routing_dataset")
        assert data["dagster/row_count"] > 0 and data["sessions"] > 0, data  # the two workspaces' journals, read
        night = meta("sleep_cycle", "sage_skills")
        assert night["harvest"]["sessions"] > 0, night  # the runs of both workspaces, harvested
        assert night["status"] not in ("no_model", "backend_error"), night  # the model answered
        assert meta("sage_bundle")["bundle_path"] == str(home / "my-sage-data" / "checkpoints" / "bundle")
        meta("decisions", "decision_ledger")
