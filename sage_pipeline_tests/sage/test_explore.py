"""Exploring checkpoints SAGE's unchanged router executes at random with a known probability, the
exact reconstruction of each logged decision's probability, and every checkpoint kind the project
writes run by SAGE's real ``ModelRouter`` in a process of its own (SAGE_PYTHON)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.schema import ROUTING_DECISION_COLUMNS
from sage_pipeline.sage import checkpoint as sr, explore as se
from sage_pipeline.sage.table import RoutingTable

REPO = Path(__file__).resolve().parents[2]
# SAGE's own models.yaml, byte for byte (the contract suite checks it against SAGE's bundled one)
SAGE_MODELS_YAML = REPO / "sage_pipeline_tests" / "routing" / "fixtures" / "sage_journal" / "models.yaml"
TEST_TABLE = {"routing": {
    "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "codestral:22b",
              "fallback_triggers": ["task_complexity_score > 0.8", "primary_failure_count >= 2"]},
    "reviewer": {"primary": "qwen3:14b-q4_K_M", "fallback": "claude-sonnet-4-5"},  # SAGE's back-compat rule
    "planner": {"primary": "llama3.2:3b", "fallback": "llama3.2:3b"},  # nothing to choose
    "shell_chat": {"primary": "llama3.2:3b", "fallback": "qwen3:14b-q4_K_M",
                   "fallback_triggers": ["task_complexity_score >= 0.5", "failure_count == 3"]},
}}
T0 = datetime(2026, 11, 27, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def sage_table() -> RoutingTable:
    return RoutingTable.load(SAGE_MODELS_YAML)


@pytest.fixture(scope="module")
def test_table(tmp_path_factory) -> RoutingTable:
    import yaml

    path = tmp_path_factory.mktemp("table") / "models.yaml"
    path.write_text(yaml.safe_dump(TEST_TABLE))
    return RoutingTable.load(path)


def space_of(table) -> ActionSpace:
    return ActionSpace.build(table).binary()


def score_grid() -> np.ndarray:
    """A fine grid with every trigger boundary and the floats just either side of it."""
    edges = [0.5, 0.8]
    near = [f(b) for b in edges for f in (lambda b: b, lambda b: np.nextafter(b, 0), lambda b: np.nextafter(b, 1),
                                          lambda b: b - 1e-9, lambda b: b + 1e-9)]
    return np.unique(np.concatenate([np.linspace(0, 1, 51), near, [0.1 + 0.7]]))  # 0.7999999999999999


# ------------------------------------------------------------------ the exploring classifier
@pytest.mark.parametrize("rate", [0.05, 0.1, 0.2, 0.5])
def test_every_explored_context_takes_the_other_model_with_exactly_the_rate(sage_table, rate):
    sp = space_of(sage_table)
    ex = se.build_exploring(sage_table, sp, se.ExploreConfig(rate=rate))
    assert set(ex.explored) == {r for r in sp.roles if r != "shell_router"}  # its primary is its fallback
    assert set(ex.rates()) == set(ex.explored)
    assert all(abs(got - rate) < 1e-15 for got in ex.rates().values())
    s = score_grid()
    for role in sp.roles:
        route = sage_table.routes[role]
        for fc in range(5):
            p = ex.fallback_probs(role, s, np.full(len(s), fc))
            target = sr.yaml_fallback(route, s, fc)
            if role == "shell_router":
                assert (p == 0).all()
                continue
            assert np.allclose(np.where(target, 1 - p, p), rate, atol=1e-15, rtol=0)


def test_every_draw_is_confident_enough_for_the_recommended_floor(test_table):
    sp = space_of(test_table)
    ex = se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.3))
    x = np.array([[s, f] for s in score_grid() for f in range(5)])
    for clf in ex.models.values():
        outs = se.outcomes(clf, x)
        assert len(outs) == 4 and abs(sum(q for q, _ in outs) - 1) < 1e-15
        for _, proba in outs:
            conf = np.abs(proba[:, 1] - 0.5) * 2
            assert conf.min() >= se.MIN_EXPLORING_CONFIDENCE - 1e-12 > se.EXPLORE_FLOOR
    assert ex.min_confidence == se.EXPLORE_FLOOR and 0 < se.EXPLORE_FLOOR <= 1 / 7


def test_roles_not_explored_keep_the_target_and_rate_zero_is_the_target(test_table):
    sp = space_of(test_table)
    ex = se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.2, roles=("coder",)))
    assert ex.explored == ("coder",)
    s = score_grid()
    for fc in range(5):
        p = ex.fallback_probs("reviewer", s, np.full(len(s), fc))
        assert np.array_equal(p, sr.yaml_fallback(test_table.routes["reviewer"], s, fc).astype(float))
    zero = se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.0))
    assert zero.explored == ()
    for role in ("coder", "shell_chat"):
        for fc in range(5):
            p = zero.fallback_probs(role, s, np.full(len(s), fc))
            assert np.array_equal(p, sr.yaml_fallback(test_table.routes[role], s, fc).astype(float))


def test_exploring_around_a_served_policy_follows_its_trees_exactly(test_table):
    from sklearn.tree import DecisionTreeClassifier

    sp = space_of(test_table)
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.random(400), rng.integers(0, 4, 400)])
    y = ((x[:, 0] > 0.37) & (x[:, 1] < 2)).astype(int)
    tree = DecisionTreeClassifier(max_depth=4).fit(x, y)
    served = sr.ServedSagePolicy(test_table, sp, {"coder": tree}, 0.55).with_every_role()
    ex = se.build_exploring(served, sp, se.ExploreConfig(rate=0.25))
    xs = np.array([[s, f] for s in np.unique(np.concatenate([score_grid(), x[:, 0]])) for f in range(5)])
    p = ex.fallback_probs("coder", xs[:, 0], xs[:, 1])
    want = np.array([served.decide("coder", s, int(f)) == "codestral:22b" for s, f in xs])
    assert np.array_equal(p, np.where(want, 0.75, 0.25))


def test_config_and_targets_are_checked(test_table):
    with pytest.raises(ValueError, match=r"exploration rate 0.6: use a number in \[0, 0.5\]"):
        se.ExploreConfig(rate=0.6)
    with pytest.raises(ValueError, match=r"roles \['ghost'\] to explore"):
        se.build_exploring(test_table, space_of(test_table), se.ExploreConfig(roles=("ghost",)))


def test_the_exploring_checkpoint_is_written_for_sages_table_and_loads_back(test_table, sage_table, tmp_path):
    sp = space_of(test_table)
    ex = se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.1))
    path, manifest_path = sr.write_sage_checkpoint(tmp_path / "sage", ex, {"source": "test"})
    m = json.loads(manifest_path.read_text())
    assert m["kind"] == "exploring" and m["min_confidence"] == se.EXPLORE_FLOOR
    assert m["exploration"]["draws"] == {"keep": 0.9, "flip": 0.1 / 0.9}
    assert m["sage_table"]["sha256"] and m["sage_table"]["roles"] == list(test_table.roles)
    assert m["sage_env"]["SAGE_MODELS_YAML"] == str(Path(test_table.source).resolve())
    back = se.load_exploring_checkpoint(tmp_path / "sage", test_table, sp)
    assert back.rates() == ex.rates() and back.explored == ex.explored
    with pytest.raises(ValueError, match="load it with sage_explore.load_exploring_checkpoint"):
        sr.load_sage_checkpoint(tmp_path / "sage", test_table, sp)
    with pytest.raises(ValueError, match="SAGE runs .*models.yaml: .*role 'coder': primary/fallback "
                       "qwen2.5-coder:1.5b/codestral:22b in the checkpoint's table, qwen2.5-coder:1.5b/"
                       "qwen2.5-coder:14b-instruct-q4_K_M in SAGE's; .*role 'architect' of SAGE's table is not in the "
                       "checkpoint's.* Fix: build the chain on SAGE's table") as err:
        sr.write_sage_checkpoint(tmp_path / "sage2", ex, {}, sage_table=sage_table)
    assert not (tmp_path / "sage2").exists() and f"SAGE_MODELS_YAML={test_table.source}" in str(err.value)
    # the pickle holds stock scikit-learn and numpy objects only
    import joblib

    assert b"sage_pipeline" not in path.read_bytes()
    assert set(joblib.load(path)) == {"models", "feature_keys"}


def test_exploration_cost_against_the_simulators_truth(sim, table, catalogue):
    """What exploring costs, exactly, on the packaged simulator: around the best binary policy
    (the oracle distilled and served) each unit of rate costs about its mean advantage over the
    other model (0.075-0.082 of a value of 0.940); around the YAML table exploring gains (the
    table is not optimal). Rate 0 is the target itself, to the last digit."""
    sp = ActionSpace.build(table, catalogue=catalogue).binary()
    tasks = sim.sample_tasks(3000, np.random.default_rng(0))
    ctx = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    served = sr.ServedSagePolicy.from_distilled(sr.distill(sim.oracle_policy(sp.mask), ctx, sp), table, sp, 0.0)
    target = se.build_exploring(served, sp, se.ExploreConfig(rate=0.0))
    assert sim.policy_value(target, tasks).mean == sim.policy_value(served, tasks).mean
    costs = {r: se.exploration_cost(sim, target, se.build_exploring(served, sp, se.ExploreConfig(rate=r)), tasks)
             for r in (0.05, 0.1, 0.2)}
    per_rate = [costs[r]["value_lost_per_unit_rate"] for r in (0.05, 0.1, 0.2)]
    assert 0 < costs[0.05]["value_lost"] < costs[0.1]["value_lost"] < costs[0.2]["value_lost"]
    assert max(per_rate) / min(per_rate) < 1.25  # ~ linear: rate x mean advantage, plus what later steps add
    assert se.exploration_cost(sim, target, target, tasks)["value_lost"] == 0.0
    yaml_target = se.build_exploring(table, sp, se.ExploreConfig(rate=0.0))
    assert se.exploration_cost(sim, yaml_target, se.build_exploring(table, sp, se.ExploreConfig(rate=0.1)),
                               tasks)["value_lost"] < 0
    print({r: round(c["value_lost"], 5) for r, c in costs.items()})


# ------------------------------------------------------------------ deployments and reconstruction
def test_deployments_are_recorded_and_looked_up(test_table, tmp_path):
    sp = space_of(test_table)
    sr.write_sage_checkpoint(tmp_path / "ck", se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.2)), {})
    a = se.record_deployment(tmp_path, tmp_path / "ck", T0)
    b = se.record_deployment(tmp_path, None, T0 + timedelta(hours=2))
    c = se.record_deployment(tmp_path, tmp_path / "ck" / "policy.joblib", T0 + timedelta(hours=3), min_confidence=0.3,
                             deployed_until=T0 + timedelta(hours=4))
    deps = se.read_deployments(se.deployments_path(tmp_path))
    assert [d.line for d in deps] == [1, 2, 3] and deps[0].sha256 == a.sha256 == c.sha256 and b.sha256 is None
    assert Path(a.path).is_file() and a.path != str(tmp_path / "ck" / "policy.joblib")  # archived by hash
    assert a.min_confidence == se.EXPLORE_FLOOR and deps[2].min_confidence == 0.3
    at = lambda h: se.deployment_at(deps, T0 + timedelta(hours=h))  # noqa: E731
    assert at(-1) is None and at(1).line == 1 and at(2.5).sha256 is None and at(3.5).line == 3 and at(5) is None
    before = se.deployments_path(tmp_path).read_text()
    with pytest.raises(se.DeploymentRecordError, match=r"sage_deployments.jsonl:4: field 'deployed_from'.*before the "
                       "end of the last window"):
        se.record_deployment(tmp_path, None, T0 + timedelta(hours=3.5))
    assert se.deployments_path(tmp_path).read_text() == before  # refused before writing
    # a hand-edited record that overlaps is named by line
    se.deployments_path(tmp_path).write_text(before + json.dumps(
        {"sha256": None, "deployed_from": (T0 + timedelta(hours=3.5)).isoformat()}) + "\n")
    with pytest.raises(se.DeploymentRecordError, match=r":4: field 'deployed_from'.*overlaps the previous window"):
        se.read_deployments(se.deployments_path(tmp_path))


@pytest.mark.parametrize("line, field, message", [
    ("not json", "<line>", "not JSON"),
    ('{"deployed_from": "2026-11-27T00:00:00Z"}', "sha256", "missing"),
    ('{"sha256": "abc", "deployed_from": "2026-11-27T00:00:00Z"}', "sha256", "64 lowercase hex"),
    ('{"sha256": null, "deployed_from": "yesterday"}', "deployed_from", "not an ISO 8601 time"),
    ('{"sha256": "' + "a" * 64 + '", "path": "x", "min_confidence": -1, "deployed_from": "2026-11-27T00:00:00Z"}',
     "min_confidence", "a number >= 0"),
    ('{"sha256": null, "deployed_from": "2026-11-27T00:00:00Z", "deployed_until": "2026-11-26T00:00:00Z"}',
     "deployed_until", "not after deployed_from"),
])
def test_a_bad_deployment_record_names_file_line_and_field(tmp_path, line, field, message):
    path = tmp_path / "deployments.jsonl"
    path.write_text('{"sha256": null, "deployed_from": "2026-11-26T00:00:00Z"}\n' + line + "\n")
    with pytest.raises(se.DeploymentRecordError, match=message) as err:
        se.read_deployments(path)
    assert (err.value.line, err.value.field) == (2, field) and f"{path}:2: field {field!r}" in str(err.value)


def decision(role, tcs, fc, route, selected, source, triggers=()):
    return {"agent_role": role, "task_complexity_score": tcs, "primary_failure_count": fc,
            "primary_model": route.primary, "fallback_model": route.fallback, "selected_model": selected,
            "policy_source": source, "matched_fallback_triggers": list(triggers)}


def test_decision_probability_for_each_kind_of_line(test_table, tmp_path):
    sp = space_of(test_table)
    coder = test_table.routes["coder"]
    # YAML only: 1 for the table's choice
    p = se.decision_probability(decision("coder", 0.9, 0, coder, coder.fallback, "yaml", ["x"]), None)
    assert (p.probability, p.provenance) == (1.0, "yaml")
    p = se.decision_probability(decision("coder", 0.9, 0, coder, coder.fallback, "learned"), None)
    assert math.isnan(p.probability) and "record the deployment" in p.note
    # an exploring checkpoint: the rate, or 1 - rate
    sr.write_sage_checkpoint(tmp_path / "ex", se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.2)), {})
    ck = se.load_deployed(se.record_deployment(tmp_path, tmp_path / "ex", T0))
    for tcs, fc, sel, want in [(0.9, 0, coder.fallback, 0.8), (0.9, 0, coder.primary, 0.2),
                               (0.3, 1, coder.fallback, 0.2), (0.3, 2, coder.primary, 0.2)]:
        p = se.decision_probability(decision("coder", tcs, fc, coder, sel, "learned"), ck)
        assert abs(p.probability - want) < 1e-15 and p.provenance == ck.sha256
    p = se.decision_probability(decision("coder", 0.3, 0, coder, coder.primary, "yaml"), ck)
    assert math.isnan(p.probability) and "impossible" in p.note  # SAGE always acts at the recommended floor
    planner = test_table.routes["planner"]  # no classifier, floor > 0: SAGE keeps its YAML
    assert se.decision_probability(decision("planner", 0.3, 0, planner, planner.primary, "yaml"), ck).probability == 1
    # a deterministic checkpoint: 1 or 0
    served = sr.ServedSagePolicy(test_table, sp, {}, 0.55).with_every_role()
    sr.write_sage_checkpoint(tmp_path / "det", served, {})
    ck = se.load_deployed(se.record_deployment(tmp_path, tmp_path / "det", T0 + timedelta(days=1)))
    assert se.decision_probability(decision("coder", 0.9, 0, coder, coder.fallback, "learned"), ck).probability == 1
    assert se.decision_probability(decision("coder", 0.9, 0, coder, coder.primary, "learned"), ck).probability == 0
    other = decision("coder", 0.9, 0, coder, coder.fallback, "learned") | {"fallback_model": "gpt-4.1"}
    p = se.decision_probability(other | {"selected_model": "gpt-4.1"}, ck)
    assert math.isnan(p.probability) and "written for coder primary/fallback" in p.note


# ------------------------------------------------------------------ SAGE's real router
SAGE_DRIVER = textwrap.dedent("""
    import glob, json, sys
    import numpy as np
    spec = json.load(open(sys.argv[1]))
    np.random.seed(spec["seed"])  # the global RNG the stratified dummies draw from
    from sage.orchestrator.model_router import ModelRouter
    router = ModelRouter()
    chosen = [router.select(role, tcs, fc) for role, tcs, fc in spec["states"]]
    lines = []
    for path in sorted(glob.glob("memory/sessions/*.log")):
        for n, raw in enumerate(open(path, encoding="utf-8"), 1):
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("type") in ("MODEL_ROUTING_DECISION", "ROUTING_POLICY_ERROR"):
                lines.append(dict(ev, source_file=path, source_line=n))
    heavy = [m for m in ("sage_pipeline", "dagster", "torch") if m in sys.modules]
    json.dump({"chosen": chosen, "lines": lines, "heavy": heavy}, open("out.json", "w"))
""")


def run_sage(py: str, tmp: Path, env: dict, states: list, seed: int = 0) -> dict:
    """SAGE's unchanged ModelRouter().select over ``states`` in a process of its own (cwd: a fresh
    folder, where SAGE writes memory/sessions/*.log); its choices and its journal lines."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps({"seed": seed, "states": states}))
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SAGE_", "PYTHON"))}
    full = {**keep, "HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp / ".config"), **env}
    proc = subprocess.run([py, "-c", SAGE_DRIVER, str(tmp / "spec.json")], cwd=tmp, env=full, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp / "out.json").read_text())
    assert out["heavy"] == []
    assert not [x for x in out["lines"] if x["type"] == "ROUTING_POLICY_ERROR"]
    return out


def frame(lines: list) -> pd.DataFrame:
    rows = [{c: x.get(c) for c in ROUTING_DECISION_COLUMNS} | {"timestamp_utc": x["timestamp"]} for x in lines]
    return pd.DataFrame(rows, columns=list(ROUTING_DECISION_COLUMNS))


def grid_states(table) -> list:
    return [[role, float(s), fc] for role in table.roles for s in score_grid() for fc in range(5)]


def test_sages_router_runs_every_checkpoint_kind_as_the_project_models_it(sage_python, sage_table, test_table,
                                                                          tmp_path):
    """For every role and every context of a grid (trigger boundaries and the floats beside them,
    failure counts 0..4), SAGE's real router decides as the project's model of the served policy:
    deterministic served checkpoints (floors 0 and 0.55, roles without a classifier) and exploring
    ones (where their probability is 0 or 1; elsewhere the choice has positive probability)."""
    py = sage_python
    for table in (sage_table, test_table):
        sp = space_of(table)
        rng = np.random.default_rng(1)
        from sklearn.tree import DecisionTreeClassifier

        x = np.column_stack([rng.random(300), rng.integers(0, 4, 300)])
        coder = DecisionTreeClassifier(max_depth=3).fit(x, ((x[:, 0] > 0.6) | (x[:, 1] >= 1)).astype(int))
        kinds = {
            "served_floor_0": sr.ServedSagePolicy(table, sp, {"coder": coder}, 0.0).with_every_role(),
            "served_floor_055": sr.ServedSagePolicy(table, sp, {"coder": coder}, 0.55),
            "exploring": se.build_exploring(table, sp, se.ExploreConfig(rate=0.2, roles=("coder", "reviewer"))),
        }
        states = grid_states(table)
        for name, policy in kinds.items():
            folder = tmp_path / f"{Path(table.source).parent.name}_{name}"
            path, manifest_path = sr.write_sage_checkpoint(folder / "ck", policy, {})
            env = json.loads(manifest_path.read_text())["sage_env"]
            assert env["SAGE_MODELS_YAML"] == str(Path(table.source).resolve())
            out = run_sage(py, folder / "run", env, states)
            lines = out["lines"]
            assert len(lines) == len(states) and out["chosen"] == [x["selected_model"] for x in lines]
            if isinstance(policy, sr.ServedSagePolicy):
                want = [policy.decide(role, s, fc) for role, s, fc in states]
                assert out["chosen"] == want, name
                continue
            se.record_deployment(folder, folder / "ck", T0)
            rec = se.reconstruct_propensities(frame(lines), se.deployments_path(folder))
            assert rec["propensity_note"].eq("").all() and (rec["propensity"] > 0).all()
            for (role, s, fc), got in zip(states, out["chosen"]):
                p = policy.fallback_probs(role, s, fc)[0]
                route = table.routes[role]
                if p in (0.0, 1.0):
                    assert got == (route.fallback if p == 1.0 else route.primary), (name, role, s, fc)


def test_sages_router_explores_with_the_reconstructed_probability(sage_python, sage_table, tmp_path):
    """The issue's bar: 20,000 decisions of SAGE's unchanged router with the exploring checkpoint;
    in every context of the grid the frequency of the fallback is the reconstructed probability
    within binomial error (4 standard errors per cell, and a chi-square over all cells)."""
    from scipy import stats

    py = sage_python
    sp = space_of(sage_table)
    rate = 0.2
    ex = se.build_exploring(sage_table, sp, se.ExploreConfig(rate=rate))
    _, manifest_path = sr.write_sage_checkpoint(tmp_path / "ck", ex, {})
    env = json.loads(manifest_path.read_text())["sage_env"]
    cells = [(role, s, fc) for role in ("planner", "coder", "debugger", "shell_router")
             for s in (0.3, 0.8, 0.85) for fc in (0, 1, 2)]
    rng = np.random.default_rng(7)
    states = [list(cells[i]) for i in rng.integers(0, len(cells), 20_000)]
    se.record_deployment(tmp_path, tmp_path / "ck", datetime.now(timezone.utc) - timedelta(seconds=1))
    out = run_sage(py, tmp_path / "run", env, states, seed=11)
    df = frame(out["lines"])
    assert len(df) == 20_000 and (df["policy_source"] == "learned").sum() == 20_000 - (df["agent_role"] ==
                                                                                         "shell_router").sum()
    rec = se.reconstruct_propensities(df, se.deployments_path(tmp_path))
    assert rec["propensity_note"].eq("").all() and set(rec["propensity_checkpoint"]) == {json.loads(
        manifest_path.read_text())["sha256"]}
    df["propensity"] = rec["propensity"]
    df["p_fallback"] = np.where(df["selected_model"] == df["fallback_model"], rec["propensity"],
                                1 - rec["propensity"])
    df["fallback"] = (df["selected_model"] == df["fallback_model"]) & (df["fallback_model"] != df["primary_model"])
    chi2, dof, report = 0.0, 0, []
    for (role, s, fc), g in df.groupby(["agent_role", "task_complexity_score", "primary_failure_count"]):
        p = g["p_fallback"].to_numpy()
        assert np.ptp(p) < 1e-15  # one probability per context, whatever was drawn (1 - 0.8 is 0.2 - 4e-17)
        p, n, k = float(p[0]), len(g), int(g["fallback"].sum())
        report.append((role, s, fc, n, round(k / n, 4), p))
        if role == "shell_router":  # its primary is its fallback: one model, probability 1
            assert (g["propensity"] == 1.0).all() and (g["policy_source"] == "yaml").all()
            continue
        assert p in (pytest.approx(rate, abs=1e-15), pytest.approx(1 - rate, abs=1e-15))
        assert abs(k / n - p) <= 4 * math.sqrt(p * (1 - p) / n), (role, s, fc, n, k, p)
        chi2 += (k - n * p) ** 2 / (n * p * (1 - p))
        dof += 1
    assert dof == 27 and stats.chi2.sf(chi2, dof) > 1e-3, (chi2, dof, report)
    print(f"chi2={chi2:.2f} dof={dof} p={stats.chi2.sf(chi2, dof):.3f}")


def test_reconstruct_propensities_reads_a_frame_as_the_ingest_writes_it(test_table, tmp_path):
    """List columns come back from parquet as arrays; a line without a timestamp has no known
    deployment once any is recorded."""
    coder = test_table.routes["coder"]
    rows = [decision("coder", 0.9, 0, coder, coder.fallback, "yaml", ["task_complexity_score > 0.8"]),
            decision("coder", 0.1, 0, coder, coder.primary, "learned")]
    df = pd.DataFrame(rows).assign(timestamp_utc=[T0 - timedelta(hours=1), T0 + timedelta(hours=1)],
                                   matched_fallback_triggers=[np.array(["task_complexity_score > 0.8"]), np.array([])])
    sr.write_sage_checkpoint(tmp_path / "ex", se.build_exploring(test_table, space_of(test_table),
                                                                 se.ExploreConfig(rate=0.2)), {})
    sha = se.record_deployment(tmp_path, tmp_path / "ex", T0).sha256
    rec = se.reconstruct_propensities(df, se.deployments_path(tmp_path))
    assert rec["propensity"].tolist() == pytest.approx([1.0, 0.8], abs=1e-15)
    assert rec["propensity_checkpoint"].tolist() == ["yaml", sha] and rec["propensity_note"].tolist() == ["", ""]
    rec = se.reconstruct_propensities(df.assign(timestamp_utc=[None, None]), se.deployments_path(tmp_path))
    assert rec["propensity"].isna().all() and rec["propensity_note"].str.startswith("no timestamp").all()
    assert se.reconstruct_propensities(df.iloc[:1].assign(timestamp_utc=[None]), [])["propensity"].tolist() == [1.0]


def test_the_deploy_command_records_the_checkpoint_and_prints_what_sage_must_run(test_table, tmp_path, capsys):
    sp = space_of(test_table)
    sr.write_sage_checkpoint(tmp_path / "ck", se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.2)), {})
    data = tmp_path / "data"
    assert se.main(["deploy", str(tmp_path / "ck"), "--data-dir", str(data), "--from",
                    "2026-11-27T10:00:00+00:00"]) == 0
    out = capsys.readouterr().out
    (dep,) = se.read_deployments(se.deployments_path(data))
    assert dep.sha256 and f"export SAGE_RL_CHECKPOINT={Path(dep.path).resolve()}" in out
    assert f"export SAGE_RL_MIN_CONFIDENCE={dep.min_confidence}" in out and dep.min_confidence > 0
    assert se.main(["deploy", "--yaml", "--data-dir", str(data), "--from", "2026-11-28T00:00:00Z"]) == 0
    assert "unset SAGE_RL_POLICY" in capsys.readouterr().out
    # out of time order: refused, naming the file, the line and the field, and nothing is written
    assert se.main(["deploy", "--yaml", "--data-dir", str(data), "--from", "2026-11-01T00:00:00Z"]) == 2
    err = capsys.readouterr().err
    assert "sage_deployments.jsonl" in err and "deployed_from" in err and "time order" in err
    assert len(se.read_deployments(se.deployments_path(data))) == 2
    assert se.main(["deploy", str(tmp_path / "nothing"), "--data-dir", str(data), "--from",
                    "2026-12-01T00:00:00Z"]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_learned_line_where_sage_ran_yaml_only_voids_every_yaml_probability(test_table, tmp_path):
    """Logs whose router explored without a recorded deployment (the project's own epsilon-greedy
    journals, or SAGE with a checkpoint nobody recorded): a YAML line there did not have probability
    1, so none is given; with the learned line inside a recorded deployment, YAML lines keep theirs."""
    decisions = pd.DataFrame([
        {"timestamp_utc": "2026-11-27T10:00:00+00:00", "agent_role": "coder", "task_complexity_score": 0.2,
         "primary_failure_count": 0, "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
         "selected_model": "qwen2.5-coder:1.5b", "matched_fallback_triggers": [], "policy_source": "yaml"},
        {"timestamp_utc": "2026-11-27T11:00:00+00:00", "agent_role": "coder", "task_complexity_score": 0.2,
         "primary_failure_count": 0, "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
         "selected_model": "codestral:22b", "matched_fallback_triggers": [], "policy_source": "learned"}])
    side = tmp_path / "routing_decisions.parquet"
    decisions.assign(timestamp_utc=pd.to_datetime(decisions["timestamp_utc"], utc=True)).to_parquet(side)
    got = se.propensity_reconstructor(tmp_path / "none.jsonl", side)(decisions.iloc[:1])
    assert math.isnan(got["propensity"].iat[0]) and got["propensity_note"].iat[0] == se.NOT_YAML_ONLY
    # without any learned line the same YAML line is SAGE's deterministic choice: probability 1
    only_yaml = tmp_path / "yaml_only.parquet"
    decisions.iloc[:1].assign(timestamp_utc=pd.to_datetime(decisions["timestamp_utc"].iloc[:1], utc=True)).to_parquet(
        only_yaml)
    assert se.propensity_reconstructor(tmp_path / "none.jsonl", only_yaml)(decisions.iloc[:1])["propensity"].iat[0] == 1
    assert se.unexplained_learned(decisions.assign(timestamp_utc=pd.to_datetime(decisions["timestamp_utc"])), []) == 1


def test_a_deployed_checkpoint_that_is_gone_leaves_its_decisions_unknown_and_says_why(test_table, tmp_path):
    sp = space_of(test_table)
    sr.write_sage_checkpoint(tmp_path / "ck", se.build_exploring(test_table, sp, se.ExploreConfig(rate=0.2)), {})
    dep = se.record_deployment(tmp_path / "data", tmp_path / "ck", deployed_from="2026-11-27T00:00:00+00:00")
    Path(dep.path).unlink()
    decision = {"timestamp_utc": "2026-11-27T10:00:00+00:00", "agent_role": "coder", "task_complexity_score": 0.2,
                "primary_failure_count": 0, "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
                "selected_model": "codestral:22b", "matched_fallback_triggers": [], "policy_source": "learned"}
    got = se.propensity_reconstructor(se.deployments_path(tmp_path / "data"))(pd.DataFrame([decision]))
    assert math.isnan(got["propensity"].iat[0]) and got["propensity_checkpoint"].iat[0] == dep.sha256
    assert "cannot be read" in got["propensity_note"].iat[0] and dep.path in got["propensity_note"].iat[0]


def test_a_decision_line_without_its_context_is_unknown_not_a_crash(tmp_path):
    """A MODEL_ROUTING_DECISION without task_complexity_score or primary_failure_count (SAGE's router always
    writes both) leaves that decision's probability unknown, saying why; routing_dataset used to stop with
    'cannot convert float NaN to integer' (found by benchmarks/fault_injection.py)."""
    base = {"timestamp_utc": "2026-11-27T10:00:00+00:00", "agent_role": "coder", "task_complexity_score": 0.2,
            "primary_failure_count": 0, "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
            "selected_model": "qwen2.5-coder:1.5b", "matched_fallback_triggers": [], "policy_source": "yaml"}
    frame = pd.DataFrame([base, base | {"primary_failure_count": np.nan}, base | {"task_complexity_score": np.nan}])
    got = se.propensity_reconstructor(tmp_path / "none.jsonl")(frame)
    assert got["propensity"].iat[0] == 1
    for i, field in ((1, "primary_failure_count"), (2, "task_complexity_score")):
        assert math.isnan(got["propensity"].iat[i]) and field in got["propensity_note"].iat[i]
