"""The simulated month: the drifting world, the deployed router's journals read back through the
ingest exactly, and a short month whose figures add up."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import pytest

from sage_pipeline.rl import ope, policy_iteration as pi
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
    # day 0 explores at epsilon_max (no model yet: 0.15 per binary decision); later days read a fitted model
    ex = [d["exploration"] for d in res.days]
    assert 0.0 < ex[0]["leave_probability"] <= 0.15 + 1e-9 and all(0.0 < e["leave_probability"] < 0.15 for e in ex[1:])
    for d in res.days[:-1]:  # the gate's paired interval and the candidate's true value, every night
        g = d["gate_difference"]
        assert g["difference_ci_low"] <= g["difference"] <= g["difference_ci_high"]
        assert d["candidate_true_value"] <= d["oracle"] + 1e-9
    for d in res.days:  # what the offline gate passed is A/B-tested; only a confirmed gain is deployed
        if d.get("promoted"):
            assert d["online_ab"]["from"] and d["online_ab"]["difference"]["ci_low"] > 0
        if "online_ab" in d:
            assert d["offline_gate_passed"] and d["promoted"] == d["online_ab"]["confirmed"]
            assert d["online_ab"]["ope_agrees"] is not None  # the gate's paired interval reached the A/B
    assert s["promotions"] + s["rejected_online"] == s["offline_gate_passed"] >= s["promotions"]
    assert s["offline_gate_wrong"] >= s["wrong_promotions"]
    deployed = [d["deployed"] for d in res.days]  # the deployed policy changes exactly after a promotion
    assert [b != a for a, b in zip(deployed, deployed[1:])] == [bool(d.get("promoted")) for d in res.days[:-1]]
    logs = sorted(p.name for p in (tmp_path / "nightly").rglob("*.log"))
    assert logs == ["2026-12-01.log", "2026-12-02.log", "2026-12-03.log", "2026-12-04.log"]
    assert res.bandit_ope.get("skipped")  # the last days cross a change: no single truth
    png = pi.plot_days(res.days)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_online_ab_confirms_a_promotion_only_above_zero():
    on, off = pi.LoopGateConfig(), pi.LoopGateConfig(confirm_online=False)
    assert on.confirm_online  # the default: the offline gate, then the online A/B
    assert pi.confirmed_online({"mean": 0.01, "ci_low": 0.002, "ci_high": 0.018}, on)
    assert not pi.confirmed_online({"mean": 0.006, "ci_low": -0.002, "ci_high": 0.014}, on)
    assert not pi.confirmed_online({"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}, on)  # a tie is no gain
    assert pi.confirmed_online({"mean": -0.01, "ci_low": -0.02, "ci_high": 0.0}, off)  # the offline gate alone


def test_a_promotion_passes_the_offline_gate_then_the_online_ab(tmp_path):
    # the defaults on seed 0: night 0's candidate clears the offline gate and the A/B confirms it
    cfg = pi.LoopConfig(days=2, seed=0, eval_tasks=300, n_boot=100, online_ab_episodes=300,
                        arms=("static_table", "nightly", "oracle"))
    night0, day1 = pi.run_month(cfg, work=tmp_path, progress=lambda *_: None).days
    ab = night0["online_ab"]
    assert night0["offline_gate_passed"] and night0["promoted"] and ab["confirmed"]
    assert ab["difference"]["ci_low"] > 0
    assert "online A/B gain" in night0["gate"] and night0["gate"].endswith("deployed")
    assert ab["ope_agrees"] is not None  # the gate's paired interval reached the A/B
    assert night0["wrong_promotion"] == (night0["candidate_true_value"] < night0["nightly_deployed"])
    assert (night0["deployed"], day1["deployed"]) == ("static_table", "served@night0")


def test_a_days_drop_in_logged_return_is_compared_only_like_with_like():
    a, b = pi.DayReturns(("t", False), 0.70, 0.0001), pi.DayReturns(("t", False), 0.66, 0.0003)
    assert b.drop_z(a) == pytest.approx(0.04 / 0.02)  # Welch: (0.70 - 0.66) / sqrt(1e-4 + 3e-4)
    assert a.drop_z(b) == pytest.approx(-2.0)  # a rise is a negative drop
    assert b.drop_z(None) is None
    assert pi.DayReturns(("served@night3", False), 0.5, 1e-4).drop_z(a) is None  # another deployed policy
    assert pi.DayReturns(("t", True), 0.5, 1e-4).drop_z(a) is None  # another exploration regime
    rows = {"task": np.array([0, 0, 1, 2]), "reward": np.array([0.5, 0.25, 1.0, 0.0])}
    day = pi.DayReturns.of(rows, 3, ("t", False))  # episode returns 0.75, 1.0, 0.0
    assert day.mean == pytest.approx(1.75 / 3) and day.var_of_mean == pytest.approx(np.var([0.75, 1, 0], ddof=1) / 3)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_detected_change_restarts_the_window_and_explores(tmp_path, enabled):
    # the gate never promotes (min_gain 1), so days 1 and 2 run the same deployed policy; on day 2
    # one model loses 60% of its quality
    cfg = pi.LoopConfig(days=4, episodes_per_day=1000, eval_tasks=300, cql_steps=50, alphas=(0.1,), floors=(0.0,),
                        n_boot=30, arms=("static_table", "nightly", "oracle"), gate=pi.LoopGateConfig(min_gain=1.0),
                        change=pi.ChangeConfig(enabled=enabled),
                        world=pi.WorldConfig(drift=True, quality_day=2, quality_drop=0.6, price_day=99))
    days = pi.run_month(cfg, work=tmp_path, progress=lambda *_: None).days
    # day 0 explored everywhere (no fitted model yet), so day 1 is not compared with it
    assert days[0]["drop_z"] is None and days[1]["drop_z"] is None
    assert days[2]["drop_z"] > cfg.change.z  # the drop shows in the logs
    assert days[2]["logged_return"] < days[1]["logged_return"]
    assert [bool(d.get("change_detected")) for d in days] == [False, False, enabled, False]
    assert days[1]["window"] == ["2026-12-01", "2026-12-02"]  # window_days 2
    if enabled:  # night 2 trains and gates on the new world only; day 3 explores at epsilon_max (0.15 a decision)
        assert days[2]["window"] == ["2026-12-03", "2026-12-03"]
        assert days[3]["exploration"]["boosted"] and days[3]["exploration"]["leave_probability"] == pytest.approx(0.15)
        assert days[3]["drop_z"] is None  # another exploration regime than day 2's
    else:
        assert days[2]["window"] == ["2026-12-02", "2026-12-03"]
        assert not days[3]["exploration"]["boosted"] and days[3]["exploration"]["leave_probability"] < 0.15


def test_bandit_logs_are_evaluated_by_ope(tmp_path, catalogue, table):
    cfg = pi.LoopConfig(days=3, episodes_per_day=1000, eval_tasks=300, arms=("static_table", "bandit", "oracle"),
                        n_boot=100)
    res = pi.run_month(cfg, work=tmp_path, catalogue=catalogue, table=table, progress=lambda *_: None)
    ope = res.bandit_ope
    assert ope["episodes"] == 3000
    for name in ("bandit_final", "static_table"):
        assert ope[name]["relative_error"] < 0.1, ope  # the bandit's logged propensities make OPE work
    assert "nightly" not in res.days[0] and "promotions" not in res.summary


def _logged(sim, tasks, rows) -> ope.LoggedData:
    t = rows["task"]
    ctx = sim.contexts(tasks.take(t), rows["step"], rows["primary_failure_count"])
    return ope.LoggedData(ctx, rows["action"].astype(np.int64), rows["reward"], rows["propensity"], t, sim.actions)


@pytest.fixture(scope="module")
def binary_world(catalogue, table):
    reward = RewardSpec(version="reward_v2")
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(reward=reward))
    space = ActionSpace.build(table, catalogue=catalogue).binary()
    static = StaticTablePolicy(table, space)
    rng = np.random.default_rng(0)
    tasks = sim.sample_tasks(4000, rng)
    data = _logged(sim, tasks, simulate_episodes(sim, tasks, EpsilonGreedyPolicy(static, 0.3), rng))
    spec = replace(ope.OPEConfig().feature_spec, roles=tuple(space.roles))
    return sim, space, static, ope.fit_q(data, static), spec


def test_gap_exploration_explores_where_leaving_the_deployed_choice_is_cheap(binary_world):
    sim, space, static, q_model, spec = binary_world
    cfg = pi.ExplorationConfig()
    tasks = sim.sample_tasks(3000, np.random.default_rng(1))
    ctx = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    # before any night there is no model: epsilon_max everywhere
    first = cfg.behaviour(static, None, spec)
    assert np.allclose(first.epsilon(ctx), cfg.epsilon_max)
    beh = cfg.behaviour(static, q_model, spec)
    eps, probs = beh.epsilon(ctx), beh.action_probs(ctx)
    assert cfg.epsilon_min - 1e-12 <= eps.min() < eps.max() <= cfg.epsilon_max + 1e-12
    assert np.allclose(probs.sum(axis=1), 1.0) and (probs[~space.mask[ctx.role]] == 0).all()
    two = space.mask[ctx.role].sum(axis=1) == 2
    assert (probs[two][space.mask[ctx.role][two]] >= cfg.epsilon_min / 2 - 1e-12).all()  # support everywhere
    # against the exact Q-function of the table: the rate is high where leaving costs little
    Q, _ = sim._backward(tasks, static)
    q = np.where(np.isfinite(Q[:, 0, 0]), Q[:, 0, 0], -np.inf)
    choice = static.choose(ctx)
    other = np.where(space.mask[ctx.role], q, -np.inf)
    other[np.arange(len(ctx)), choice] = -np.inf
    gap = (q[np.arange(len(ctx)), choice] - other.max(axis=1))[two]
    leave = 1.0 - probs[np.arange(len(ctx)), choice][two]
    assert np.corrcoef(leave, np.maximum(gap, 0.0))[0, 1] < -0.3
    # the same share of decisions leaving the table's choice uniformly would cost far more
    assert (leave * gap).mean() < 0.6 * leave.mean() * gap.mean(), ((leave * gap).mean(), leave.mean() * gap.mean())


def test_gap_explorations_logged_propensities_are_the_probabilities_it_acted_with(binary_world):
    sim, space, static, q_model, spec = binary_world
    beh = pi.ExplorationConfig().behaviour(static, q_model, spec)
    tasks = sim.sample_tasks(20_000, np.random.default_rng(2))
    rows = simulate_episodes(sim, tasks, beh, np.random.default_rng(3))
    data = _logged(sim, tasks, rows)
    assert np.allclose(rows["propensity"], beh.action_probs(data.contexts)[np.arange(len(data)), data.action])
    ex = pi.exploration_summary(sim, tasks, rows, static, beh)
    se = np.sqrt(ex["leave_probability"] / len(data))
    assert abs(ex["left_share"] - ex["leave_probability"]) < 4 * se, ex
    # the journals support every candidate: OPE of the table on them has an answer
    assert not ope.evaluate_policy(data, static, ope.OPEConfig(n_boot=20)).no_support


def test_config_errors():
    with pytest.raises(ValueError, match=r"epsilon_max\n  Input should be greater than 0"):
        pi.ExplorationConfig(epsilon_max=0.0)
    with pytest.raises(ValueError, match=r"epsilon_min \(0.5\) must be <= epsilon_max \(0.3\)"):
        pi.ExplorationConfig(epsilon_min=0.5, epsilon_max=0.3)
    with pytest.raises(ValueError, match=r"rule\n  Input should be 'gap' or 'uniform'"):
        pi.ExplorationConfig(rule="boltzmann")
    with pytest.raises(ValueError, match="arms"):
        pi.LoopConfig(arms=("nightly", "ppo"))
    with pytest.raises(ValueError, match=r"change.z\n  Input should be greater than 0"):
        pi.LoopConfig(change={"z": 0})
    with pytest.raises(ValueError, match=r"explore_days\n  Input should be greater than or equal to 0"):
        pi.ChangeConfig(explore_days=-1)
    # every alpha and floor of the nightly grid is checked before the month starts, not on its first night
    with pytest.raises(ValueError, match=r"alphas.1\n  Input should be greater than or equal to 0"):
        pi.MonthConfig(alphas=[0.1, -0.5])
    with pytest.raises(ValueError, match=r"floors.0\n  Input should be less than or equal to 1"):
        pi.LoopConfig(floors=[1.5])
    with pytest.raises(ValueError, match=r"alphas.0\n  Input should be a finite number"):
        pi.MonthConfig(alphas=[float("nan")])
