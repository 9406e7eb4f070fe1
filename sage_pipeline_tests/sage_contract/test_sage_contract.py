"""The contract with SAGE, tested against SAGE's own code (SAGE_PYTHON: SAGE installed from
SAGE_SRC in a virtualenv of its own). Skipped, and said so in the summary, without it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from sage_pipeline.rl.router import Router
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage.table import RoutingTable

ROLES_WITH_STEPS = {"reviewer", "debugger", "orchestrator"}  # what `sage run` writes TRAJECTORY_STEPs for


def _run_sage(sage_python: str, code: str, cwd: Path, env: dict | None = None) -> str:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    full_env.update(env or {})
    out = subprocess.run([sage_python, "-c", code], cwd=cwd, env=full_env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _lines(sessions: Path) -> list[tuple[str, str]]:
    return [(p.name, line) for p in sorted(sessions.glob("*.log")) for line in p.read_text().splitlines()]


def test_sage_writes_every_shape_sage_run_produces(sage_journals):
    sessions, summary = sage_journals(days=2, sessions_per_day=3, tasks=8, rotate_mb=0.02, seed=1, timeout_rate=0.15)
    names = {p.name for p in sessions.glob("*.log")}
    assert {"2026-11-01.log", "2026-11-01.1.log", "2026-11-02.log"} <= names  # rotated by SAGE's manager
    lines = _lines(sessions)
    text = [line for _, line in lines if not line.startswith("{")]
    assert any(re.fullmatch(r"\[\S+\] CHECKPOINT completed=\d+ pending=\d+", t) for t in text)
    assert any(t.startswith("[TOKEN_SUMMARY] total_tokens=") for t in text)
    events = [json.loads(line) for _, line in lines if line.startswith("{")]
    steps = [e for e in events if e["type"] == "TRAJECTORY_STEP"]
    assert {e["agent"] for e in steps} == ROLES_WITH_STEPS
    assert any(e["agent"] == "orchestrator" and e["action"]["model_chosen"] == "" for e in steps)
    decided = {e["agent_role"] for e in events if e["type"] == "MODEL_ROUTING_DECISION"}
    assert "coder" not in decided and {"planner", "reviewer", "debugger"} <= decided  # the coder's bandit logs none
    sessions_ids = {e["session_id"] for e in events}
    assert len(sessions_ids) == summary["sessions"] == 6 and all(re.fullmatch(r"[0-9a-f]{32}", s)
                                                                  for s in sessions_ids)


def test_without_sage_session_id_lines_carry_no_session(sage_journals):
    sessions, _ = sage_journals(days=1, sessions_per_day=2, tasks=3, no_session_id=True)
    events = [json.loads(line) for _, line in _lines(sessions) if line.startswith("{")]
    assert events and not any("session_id" in e for e in events)


def test_router_lines_are_shaped_as_sage_log_event_shapes_them(sage_python, tmp_path):
    """The same decision by SAGE's ModelRouter (YAML) and by the project's Router deferring to
    the table: same keys in the same order (the project's one extension, ``propensity``, just
    before the ids), same values, same ids from the environment."""
    models_yaml = tmp_path / "models.yaml"
    models_yaml.write_text(yaml.safe_dump({"routing": {
        "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "qwen2.5-coder:14b-instruct-q4_K_M",
                  "fallback_triggers": ["primary_failure_count >= 2", "task_complexity_score > 0.8"]},
        "debugger": {"primary": "codestral:22b", "fallback": "qwen2.5-coder:14b-instruct-q4_K_M",
                     "fallback_triggers": ["primary_failure_count >= 1"]}}}))
    env = {"SAGE_SESSION_ID": "0123456789abcdef0123456789abcdef", "SAGE_TRACE_ID": "trace-1"}
    decisions = [("coder", 0.9, 0), ("coder", 0.3, 2), ("coder", 0.3, 0), ("debugger", 0.5, 1)]
    _run_sage(sage_python, "from pathlib import Path\nfrom sage.orchestrator.model_router import ModelRouter\n"
              f"r = ModelRouter(Path({str(models_yaml)!r}))\n"
              + "".join(f"r.select({role!r}, task_complexity_score={c}, failure_count={f})\n"
                        for role, c, f in decisions), tmp_path, env)
    sage_lines = [json.loads(x) for x in next((tmp_path / "memory" / "sessions").glob("*.log")).read_text()
                  .splitlines()]

    class Defer:  # no confidence anywhere: the table decides every time
        name = "defer"

        def __init__(self, space):
            self.actions, self.role_mask, self._k = space.actions, space.mask, len(space.actions)

        def action_probs(self, ctx):
            return np.full((len(ctx), self._k), 1.0 / self._k)

    table = RoutingTable.load(models_yaml)
    space = ActionSpace.build(table, [])
    journal = tmp_path / "project.log"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        router = Router(Defer(space), table, space, min_confidence=0.99, journal=journal)
        for role, c, f in decisions:
            router.route(role, c, f, f)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    ours = [json.loads(x) for x in journal.read_text().splitlines()]
    assert len(ours) == len(sage_lines) == len(decisions)
    for s, o in zip(sage_lines, ours):
        assert [k for k in o if k != "propensity"] == list(s)
        assert list(o)[-3] == "propensity" and o["propensity"] == 1.0
        assert {k: v for k, v in o.items() if k not in ("timestamp", "propensity")} == \
               {k: v for k, v in s.items() if k != "timestamp"}


def test_sage_exporter_reads_the_project_s_synthetic_journals(sage_python, sim, tmp_path):
    """The journals the project writes in SAGE's shape (synthetic_sessions) are read by SAGE's
    own exporter (rl/export_dataset.py): every TRAJECTORY_STEP of a role SAGE routes, none
    dropped."""
    from sage_pipeline.routing.collector import CollectorConfig, collect

    out = tmp_path / "synthetic"
    collect(sim, out, CollectorConfig(episodes=60, seed=3, sessions_per_day=5))
    logs = sorted(out.rglob("*.log"))
    assert logs
    steps = Counter()
    for p in logs:
        for line in p.read_text().splitlines():
            e = json.loads(line)
            if e["type"] == "TRAJECTORY_STEP":
                steps[e["agent"]] += 1
    code = ("import json\nfrom pathlib import Path\nfrom sage.rl.export_dataset import load_all_events, "
            "export_routing_rows, ROUTER_ROLES\n"
            f"ev = load_all_events([Path(p) for p in {[str(p) for p in logs]!r}])\n"
            "rows = export_routing_rows(ev)\n"
            "print(json.dumps({'rows': len(rows), 'roles': sorted(ROUTER_ROLES)}))\n")
    got = json.loads(_run_sage(sage_python, code, tmp_path).strip().splitlines()[-1])
    assert got["rows"] == sum(n for role, n in steps.items() if role in set(got["roles"]))


FIXTURE = Path(__file__).parents[1] / "routing" / "fixtures" / "sage_journal"
# the two runs its README gives (days with `sage run`'s session ids, rotated; days without)
FIXTURE_RUNS = (dict(start="2026-11-16", days=3, sessions_per_day=12, tasks=8, seed=20261116, rotate_mb=0.25),
                dict(start="2026-11-19", days=3, sessions_per_day=4, tasks=8, seed=20261119, no_session_id=True))


def test_the_journal_fixture_is_what_sage_writes(sage_python, tmp_path):
    """The committed fixture is SAGE's output byte for byte: regenerated here by SAGE's code."""
    from sage_pipeline_tests.sage_contract.sage_journals import write_journals

    ws = tmp_path / "ws"
    for run in FIXTURE_RUNS:
        write_journals(ws, models_yaml=FIXTURE / "models.yaml", **run)
    ours = {p.name: p.read_bytes() for p in (FIXTURE / "memory" / "sessions").iterdir()}
    sage = {p.name: p.read_bytes() for p in (ws / "memory" / "sessions").iterdir()}
    assert sorted(ours) == sorted(sage)
    assert [n for n in ours if ours[n] != sage[n]] == []


def test_the_fixture_models_yaml_is_sage_s_own(sage_python, tmp_path):
    code = "from sage.config.paths import bundled_models_yaml\nprint(bundled_models_yaml())\n"
    path = Path(_run_sage(sage_python, code, tmp_path).strip().splitlines()[-1])
    assert path.read_bytes() == (FIXTURE / "models.yaml").read_bytes()


def test_sage_running_the_exploring_checkpoint_gives_logs_with_exact_probabilities_and_support(
        sage_journals, tmp_path):
    """The loop of issue 32 with SAGE's own code: the exploring checkpoint written for SAGE's table
    and recorded as deployed; SAGE's workflow functions (ModelRouter with SAGE_RL_POLICY=1) write
    journals; the ingest and the routing dataset give every routed decision the probability SAGE had
    of it, from the line and the deployment, and the debugger's contexts now see both models."""
    import pyarrow.parquet as pq

    from sage_pipeline.routing import ingest, routing_dataset as rd
    from sage_pipeline.sage import checkpoint as sr, explore as se

    table = RoutingTable.load(FIXTURE / "models.yaml")
    space = ActionSpace.build(table, []).binary()
    rate = 0.25
    sr.write_sage_checkpoint(tmp_path / "ck", se.build_exploring(table, space, se.ExploreConfig(rate=rate)), {},
                             sage_table=FIXTURE / "models.yaml")
    data = tmp_path / "data"
    dep = se.record_deployment(data, tmp_path / "ck", deployed_from="2026-10-31T00:00:00+00:00")
    sessions, _ = sage_journals(days=2, sessions_per_day=6, tasks=8, seed=7, models_yaml=FIXTURE / "models.yaml",
                                checkpoint=dep.path, min_confidence=dep.min_confidence)
    events = [json.loads(line) for _, line in _lines(sessions) if line.startswith("{")]
    mrd = [e for e in events if e["type"] == "MODEL_ROUTING_DECISION"]
    assert not [e for e in events if e["type"] == "ROUTING_POLICY_ERROR"]  # SAGE loaded it
    assert {e["policy_source"] for e in mrd} == {"learned"}  # every draw confident enough: the checkpoint acts
    res = ingest.ingest(ingest.IngestConfig((sessions,)), tmp_path / "routing", progress=lambda *_: None)
    assert res.stats.to_dict()["quarantined_lines"] == 0
    files, _, report = rd.build_routing_dataset_files(
        res.trajectories, table, None, rd.DatasetConfig(), tmp_path / "ds", res.routing_decisions, res.token_usage,
        propensity_of=se.propensity_reconstructor(se.deployments_path(data), res.routing_decisions))
    df = pq.read_table(files.parquet).to_pandas()
    routed = df[df["decision_source"] == "routing_decision"]
    assert len(routed) > 0 and (routed["propensity_source"] == "reconstructed").all()
    assert report.propensity_from == {dep.sha256: len(routed)}
    assert set(np.round(routed["propensity"], 12)) <= {rate, 1 - rate}  # exact: the other model at the rate
    took_other = routed["model"] != routed["table_model"]
    assert np.allclose(routed.loc[took_other, "propensity"], rate)
    assert np.allclose(routed.loc[~took_other, "propensity"], 1 - rate)
    assert took_other.any() and (~took_other).any()
    # the coder is SAGE's bandit's: no checkpoint reaches it, and its rows say so
    coder = df[df["role"] == "coder"]
    assert len(coder) and coder["propensity"].isna().all() and rd.BANDIT_NOTE in report.propensity_unknown
