"""The simulated month: the drifting world, the deployed router's journals read back through the
ingest exactly, and a short month whose figures add up."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone

import numpy as np
import pytest

from sage_pipeline.rl import policy_iteration as pi
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.collector import simulate_episodes
from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.routing.routing_simulator import RoutingSimulator, SimulatorConfig


def test_the_drifting_world_changes_on_its_days(catalogue):
    w = pi.WorldConfig(drift=True)
    assert pi.WorldConfig().catalogue(catalogue, 25) is catalogue
    assert w.catalogue(catalogue, 9).models == catalogue.models
    q, p = catalogue.index[w.quality_model], catalogue.index[w.price_model]
    day10, day20 = w.catalogue(catalogue, 10), w.catalogue(catalogue, 20)
    cap = catalogue.models[q].capability
    assert day10.models[q].capability == pytest.approx({r: 0.7 * c for r, c in cap.items()})
    assert day10.models[p] == catalogue.models[p]
    tokens = np.array([4000.0])
    assert day20.cost_usd(np.array([p]), tokens)[0] == pytest.approx(2 * catalogue.cost_usd(np.array([p]), tokens)[0])
    assert day20.models[q].capability == day10.models[q].capability
    with pytest.raises(ValueError, match="drift model 'nope' is not in the catalogue"):
        pi.WorldConfig(drift=True, price_model="nope").catalogue(catalogue, 0)


def test_the_routers_journal_reads_back_exactly(tmp_path, catalogue, table):
    reward = RewardSpec(version="reward_v2")
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(reward=reward))
    space = ActionSpace.build(table, catalogue=catalogue).binary()
    rng = np.random.default_rng(0)
    tasks = sim.sample_tasks(300, rng)
    rows = simulate_episodes(sim, tasks, EpsilonGreedyPolicy(StaticTablePolicy(table, space), 0.2), rng)
    day = datetime(2026, 12, 3, tzinfo=timezone.utc)
    n = pi.write_journal(tmp_path / "logs" / "2026-12-03.log", sim, tasks, rows, day, "t", 250, rng)
    events = [json.loads(line) for line in (tmp_path / "logs" / "2026-12-03.log").read_text().splitlines()]
    types = Counter(e["type"] for e in events)
    assert n == len(events) and types["SESSION_START"] == types["SESSION_END"] > 0
    assert types["MODEL_ROUTING_DECISION"] == types["TOKEN_USAGE"] == types["TRAJECTORY_STEP"] == len(rows["task"])
    assert not any("step" in e for e in events if e["type"] == "TRAJECTORY_STEP")  # SAGE writes none
    df, built_space = pi.logged_dataset([tmp_path / "logs"], tmp_path / "work", table, catalogue, reward)
    assert len(df) == len(rows["task"]) and tuple(built_space.actions) == tuple(sim.actions)
    assert (df["reward_version"] == "reward_v2").all()
    # every decision's model, propensity and cost-adjusted reward as simulated
    assert sorted(df["propensity"].round(8)) == sorted(np.round(rows["propensity"], 8))
    assert df["reward"].sum() == pytest.approx(rows["reward"].sum(), abs=1e-3)
    assert sorted(df["action_index"]) == sorted(rows["action"])


def test_a_short_month_adds_up(tmp_path, catalogue, table):
    cfg = pi.LoopConfig(days=4, episodes_per_day=400, eval_tasks=300, cql_steps=100, alphas=(0.1,), floors=(0.0,),
                        n_boot=50, online_ab_episodes=300,
                        world=pi.WorldConfig(drift=True, quality_day=2, price_day=3))
    res = pi.run_month(cfg, work=tmp_path, catalogue=catalogue, table=table, progress=lambda *_: None)
    assert [d["day"] for d in res.days] == [0, 1, 2, 3]
    for d in res.days:  # the oracle is the best binary policy of the day's world: no arm beats it
        assert all(d["oracle"] >= d[a] - 1e-9 for a in ("static_table", "bandit", "nightly", "nightly_deployed"))
    assert res.days[2]["oracle"] < res.days[1]["oracle"]  # the quality drop costs even the oracle
    s = res.summary
    for arm in ("static_table", "bandit", "nightly"):
        assert s["cumulative_regret"][arm] == pytest.approx(sum(d["oracle"] - d[arm] for d in res.days))
    assert s["promotions"] == sum(bool(d.get("promoted")) for d in res.days)
    assert set(s["recovery"]) == {"2", "3"}
    assert res.days[0]["deployed"] == "static_table" and "promoted" not in res.days[-1]  # the last night: none
    for d in res.days:
        if d.get("promoted"):
            assert d["online_ab"]["from"] and "difference" in d["online_ab"]
    logs = sorted(p.name for p in (tmp_path / "nightly").rglob("*.log"))
    assert logs == ["2026-12-01.log", "2026-12-02.log", "2026-12-03.log", "2026-12-04.log"]
    assert res.bandit_ope.get("skipped")  # the last days cross a change: no single truth
    png = pi.plot_days(res.days)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_bandit_logs_are_evaluated_by_ope(tmp_path, catalogue, table):
    cfg = pi.LoopConfig(days=3, episodes_per_day=1000, eval_tasks=300, arms=("static_table", "bandit", "oracle"),
                        n_boot=100)
    res = pi.run_month(cfg, work=tmp_path, catalogue=catalogue, table=table, progress=lambda *_: None)
    ope = res.bandit_ope
    assert ope["episodes"] == 3000
    for name in ("bandit_final", "static_table"):
        assert ope[name]["relative_error"] < 0.1, ope  # the bandit's logged propensities make OPE work
    assert "nightly" not in res.days[0] and "promotions" not in res.summary


def test_config_errors():
    with pytest.raises(ValueError, match="epsilon must lie in"):
        pi.LoopConfig(epsilon=0.0)
    with pytest.raises(ValueError, match="arms"):
        pi.LoopConfig(arms=("nightly", "ppo"))
