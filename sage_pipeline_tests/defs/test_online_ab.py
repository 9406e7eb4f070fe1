"""online_ab materialized in-process: the served checkpoint against the table in the simulator, its
checks, and what it says when there is nothing to compare."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pytest

from sage_pipeline.defs.online_ab import ONLINE_AB_CHECKS, online_ab
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.routing import collector
from sage_pipeline.routing.action_space import FILE_NAME, ActionSpace
from sage_pipeline.routing.catalogue import SAGE_CATALOGUE, ModelCatalogue
from sage_pipeline.routing.policy import StaticTablePolicy
from sage_pipeline.routing.routing_simulator import RoutingSimulator
from sage_pipeline.sage import checkpoint as sage_router
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable


# the sage resource's default pair, SAGE's own table and its catalogue (these fixtures shadow conftest's,
# which are the project's example multi-model pair)
@pytest.fixture(scope="module")
def catalogue() -> ModelCatalogue:
    return ModelCatalogue.load(SAGE_CATALOGUE)


@pytest.fixture(scope="module")
def table() -> RoutingTable:
    return RoutingTable.load(SAGE_TABLE)


@pytest.fixture(scope="module")
def sim(catalogue, table) -> RoutingSimulator:
    return RoutingSimulator(catalogue, table)


def _materialize(root, episodes: int = 600):
    return dg.materialize([online_ab, *ONLINE_AB_CHECKS], resources={"sage": SageResource(data_dir=str(root))},
                          run_config={"ops": {"online_ab": {"config": {"episodes": episodes, "seed": 1}}}},
                          instance=dg.DagsterInstance.ephemeral())


def _meta(result) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node("online_ab")[-1].metadata.items()}


def _checks(result) -> dict:
    return {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def _served_root(root, sim, table, catalogue, ope_gain: float, ope_half_width: float | None = None):
    """A root as the chain leaves it: the collector's simulator.json, the action space, and a SAGE
    checkpoint (the best binary policy distilled) whose manifest records offline_eval's summary and,
    with ``ope_half_width``, the gate's paired interval of the gain (checkpoints before it had none)."""
    collector.collect(sim, root / "sessions" / "synthetic", collector.CollectorConfig(episodes=200, seed=0),
                      progress=lambda *_: None, versions_dir=root / ".synthetic_versions")
    space = ActionSpace.build(table, catalogue=catalogue)
    space.save(root / "routing" / FILE_NAME)
    binary = space.binary()
    tasks = sim.sample_tasks(4000, np.random.default_rng(0))
    ctx = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    oracle = sim.oracle_policy(binary.mask)
    served = sage_router.ServedSagePolicy.from_distilled(sage_router.distill(oracle, ctx, binary), table, binary,
                                                         0.2, name="oracle_served")
    v_static = sim.policy_value(StaticTablePolicy(table, binary), tasks).mean
    v_served = sim.policy_value(served, tasks).mean
    summary = [{"policy": "static_table", "step_dr_clip": v_static},
               {"policy": "oracle_served", "step_dr_clip": v_static + (v_served - v_static) * ope_gain}]
    gain = (v_served - v_static) * ope_gain
    extra = {} if ope_half_width is None else {"gain_over_table": {
        "difference": gain, "difference_ci_low": gain - ope_half_width, "difference_ci_high": gain + ope_half_width}}
    sage_router.write_sage_checkpoint(root / "checkpoints" / "sage", served,
                                      {"policy": "oracle_served", "source": "test", "summary": summary, **extra})
    return v_served - v_static


def test_served_policy_against_the_table_with_common_random_numbers(tmp_path, sim, table, catalogue):
    gain = _served_root(tmp_path, sim, table, catalogue, ope_gain=1.0)
    result = _materialize(tmp_path)
    assert result.success
    meta = _meta(result)
    assert meta["ran"] is True and meta["policy"] == "oracle_served" and meta["episodes_per_arm"] == 600
    assert meta["difference_ci_low"] <= meta["true_difference"] <= meta["difference_ci_high"]
    assert meta["difference_ci_low"] > 0  # the best binary policy beats the table, and the test sees it
    assert abs(meta["true_difference"] - gain) < 0.03  # fresh tasks, the same population
    assert meta["ope_difference_inside_interval"] == "True"
    assert "pass_rate" in meta["arms"] and "latency_s" in meta["arms"] and "cost_usd" in meta["arms"]
    checks = _checks(result)
    assert checks["online_ab_agrees_with_offline_eval"].passed
    assert checks["online_ab_served_not_worse"].passed
    report = json.loads((tmp_path / "reports" / "online_ab.json").read_text())
    assert set(report["arms"]) == {"static_table", "oracle_served"}


def test_an_ope_estimate_outside_the_online_interval_warns(tmp_path, sim, table, catalogue):
    _served_root(tmp_path, sim, table, catalogue, ope_gain=4.0)  # OPE claimed four times the real gain
    result = _materialize(tmp_path)
    assert result.success
    assert _meta(result)["ope_difference_inside_interval"] == "False"
    check = _checks(result)["online_ab_agrees_with_offline_eval"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN


@pytest.mark.parametrize("ope_gain, half_width, inside, agrees", [
    (1.3, 0.05, "False", "True"),    # outside the sharp online interval, but within OPE's own error: no warning
    (4.0, 0.01, "False", "False"),   # four times the real gain with a narrow interval: a real disagreement
    (1.0, 0.02, "True", "True"),
])
def test_agreement_counts_both_errors(tmp_path, sim, table, catalogue, ope_gain, half_width, inside, agrees):
    _served_root(tmp_path, sim, table, catalogue, ope_gain=ope_gain, ope_half_width=half_width)
    result = _materialize(tmp_path)
    meta = _meta(result)
    assert (meta["ope_difference_inside_interval"], meta["ope_agrees_within_both_errors"]) == (inside, agrees)
    check = _checks(result)["online_ab_agrees_with_offline_eval"]
    assert check.passed == (agrees == "True") and check.metadata["rule"].value == "within both errors"
    assert check.metadata["ope_difference_inside_interval"].value == inside


@pytest.mark.parametrize("what", ["no_checkpoint", "no_simulator"])
def test_nothing_to_compare_is_said(tmp_path, sim, table, catalogue, what):
    if what == "no_simulator":
        _served_root(tmp_path, sim, table, catalogue, ope_gain=1.0)
        (tmp_path / "sessions" / "synthetic").unlink()  # the collector's link: real logs only
    result = _materialize(tmp_path)
    assert result.success
    meta = _meta(result)
    assert meta["ran"] is False
    assert ("nothing has passed the gate" if what == "no_checkpoint" else "simulator.json is missing") in meta["reason"]
    assert all(c.passed for c in _checks(result).values())
