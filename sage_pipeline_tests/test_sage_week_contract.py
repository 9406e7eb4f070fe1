"""The shipped SAGE week is what SAGE's code writes (marker sage_contract: needs SAGE_PYTHON, SAGE installed from
SAGE_SRC in a virtualenv of its own; skipped, and said so, without it).

* SAGE's own readers take it whole: its journal reader (``sage.rl.export_dataset.load_all_events``) returns one
  event per JSON line of every journal, its exporter one routing row per TRAJECTORY_STEP of a role it routes, its
  bandit (``sage.rl.ucb_bandit.UCBStrategyBandit``) loads every workspace's ``memory/rl/ucb_bandit.json``;
* the week was written with the models.yaml SAGE ships (the manifest's sha256 is the installed SAGE's);
* one small day regenerated now by SAGE's ``sage run`` (sage_world.sage_week.run_days) writes no journal line shape
  (event type and its fields) and no workspace file kind the week lacks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from sage_pipeline import artifacts
from sage_pipeline.sage import week as W


@pytest.fixture(scope="module")
def week(tmp_path_factory) -> W.Week:
    return W.embedded_week(tmp_path_factory.mktemp("week"))


def _sage(sage_python: str, code: str, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    out = subprocess.run([sage_python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _journals(root: Path) -> list[Path]:
    return sorted(root.rglob("memory/sessions/*.log"))


def _shapes(files: list[Path]) -> Counter:
    """Each journal line's shape: (event type, its top-level fields) for JSON lines, else SAGE's text line's kind."""
    out: Counter = Counter()
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                ev = json.loads(line)
                out[(ev.get("type"), tuple(sorted(ev)))] += 1
            elif line.strip():
                out[("text", re.sub(r"^\[[^]]*\]\s*", "[ts] ", line).split(" ")[1 if line.startswith("[") else 0])] += 1
    return out


def _kinds(workspaces: list[Path]) -> set[str]:
    """Each workspace file as a kind: its path in the workspace with the task's names generalised."""
    out = set()
    for ws in workspaces:
        for f in ws.rglob("*"):
            if f.is_file() and not {"__pycache__", ".pytest_cache"} & set(f.relative_to(ws).parts):
                out.add(re.sub(r"sol_[a-z0-9_]+?_\d{4}", "sol_<task>", re.sub(r"\d{4}-\d{2}-\d{2}", "<date>",
                                                                                str(f.relative_to(ws)))))
    return out


def test_sage_s_own_readers_take_the_week_whole(sage_python, week, tmp_path):
    files = _journals(week.workspaces)
    json_lines = sum(ln.startswith("{") for f in files for ln in f.read_text(encoding="utf-8").splitlines())
    steps = Counter(json.loads(ln)["agent"] for f in files for ln in f.read_text(encoding="utf-8").splitlines()
                    if ln.startswith("{") and json.loads(ln).get("type") == "TRAJECTORY_STEP")
    bandits = sorted(str(p) for p in week.workspaces.rglob("memory/rl/ucb_bandit.json"))
    code = ("import json\nfrom pathlib import Path\nfrom sage.rl.export_dataset import load_all_events, "
            "export_routing_rows, ROUTER_ROLES\nfrom sage.rl.ucb_bandit import UCBStrategyBandit\n"
            f"ev = load_all_events([Path(p) for p in {[str(p) for p in files]!r}])\n"
            "rows = export_routing_rows(ev)\n"
            f"stats = [UCBStrategyBandit(p)._stats for p in {bandits!r}]\n"
            "print(json.dumps({'events': len(ev), 'rows': len(rows), 'roles': sorted(ROUTER_ROLES), "
            "'bandits': [sum(int(v['count']) for v in s.values()) for s in stats]}))\n")
    got = _sage(sage_python, code, tmp_path)
    assert got["events"] == json_lines > 0
    assert got["rows"] == sum(n for role, n in steps.items() if role in set(got["roles"])) > 0
    assert len(got["bandits"]) == len(week.workspace_dirs) and all(n > 0 for n in got["bandits"])


def test_the_week_was_written_with_the_models_yaml_sage_ships(sage_python):
    from sage_pipeline.sage_world.harness import SageInstall

    install = SageInstall.find(sage_python)
    assert W.load_manifest()["sage"]["models_yaml_sha256"] == artifacts.file_sha256(install.models_yaml)


def test_a_day_sage_writes_now_has_no_shape_the_week_lacks(sage_python, week, tmp_path):
    """One day of 3 runs in a world of 21 tasks, written now by SAGE's `sage run` as the week was."""
    from sage_pipeline.sage_world import sage_week as SW
    from sage_pipeline.sage_world.harness import SageInstall

    settings = {**W.load_manifest()["settings"], "days": 1, "runs_per_day": 3, "pool": 21}
    res = SW.run_days(SageInstall.find(sage_python), tmp_path / "day", SW.WeekConfig(**settings),
                      progress=lambda m: None)
    assert res.days[0]["summary"]["finished"] == 3
    now, shipped = _shapes(_journals(tmp_path / "day")), _shapes(_journals(week.workspaces))
    assert set(now) <= set(shipped), f"shapes SAGE writes now that the week lacks: {sorted(set(now) - set(shipped))}"
    new_kinds = _kinds(sorted((tmp_path / "day").glob("day-*/ws-*"))) - _kinds(week.workspace_dirs)
    assert not new_kinds, f"workspace files SAGE writes now that the week lacks: {sorted(new_kinds)}"
