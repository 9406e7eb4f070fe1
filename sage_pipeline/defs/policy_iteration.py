"""policy_iteration: a simulated month of deploy -> log -> retrain -> gate -> promote, beside the
static table, the online bandit and the oracle (core: sage_pipeline.rl.policy_iteration)."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import time

import dagster as dg
from pydantic import Field

from sage_pipeline import artifacts, markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import section, to_core
from sage_pipeline.rl import policy_iteration as pi
from sage_pipeline.rl.bandit import ALGORITHMS, BanditConfig

GROUP = "closed_loop"
WORLDS = ("stationary", "drifting")
_BANDIT = BanditConfig()


class ExplorationSection(dg.Config, pi.ExplorationConfig):
    """``sage_pipeline.rl.policy_iteration.ExplorationConfig``: how the deployed router explores."""


class LoopGateSection(dg.Config, pi.LoopGateConfig):
    """``sage_pipeline.rl.policy_iteration.LoopGateConfig``: the nightly gate's rule and bar."""


class ChangeSection(dg.Config, pi.ChangeConfig):
    """``sage_pipeline.rl.policy_iteration.ChangeConfig``: what the loop does when its journals show a change."""


class PolicyIterationConfig(dg.Config, pi.MonthConfig):
    """policy_iteration's run config: ``sage_pipeline.rl.policy_iteration.MonthConfig`` (days,
    episodes_per_day, eval_tasks, seed, window_days, cql_steps, alphas, floors), its exploration,
    gate and change detection as sections, and the asset's own two: the worlds to run and the bandit's rule."""

    exploration: ExplorationSection = section(pi.MonthConfig, "exploration", ExplorationSection)
    gate: LoopGateSection = section(pi.MonthConfig, "gate", LoopGateSection)
    change: ChangeSection = section(pi.MonthConfig, "change", ChangeSection)
    worlds: list[str] = Field(list(WORLDS), description="'stationary' and/or 'drifting' (from day 10 one model's "
                              "quality drops 30%, from day 20 another's price doubles; the first 10 days are the "
                              "stationary world)")
    bandit: str = Field(_BANDIT.algorithm, description=f"the online bandit arm: one of {', '.join(ALGORITHMS)}")
    # the drifting world's two models, in the sage resource's default catalogue (SAGE's own table): the local
    # model most of SAGE's roles fall back to, and its one API model (the core's defaults name the example
    # catalogue's models, which benchmarks/closed_loop.py runs; set both when the resource names that catalogue)
    quality_model: str = Field("qwen2.5-coder:14b-instruct-q4_K_M", description="drifting world: the model whose "
                               "capability drops from day 10 (a model of the sage resource's catalogue)")
    price_model: str = Field("claude-sonnet-4-5", description="drifting world: the model whose price doubles from "
                             "day 20 (a priced model of the sage resource's catalogue)")


@dg.asset(group_name=GROUP, kinds={"python", "pytorch"},
          description="A simulated month (default 30 days) of what a team runs: each day the deployed router routes "
                      "that day's simulated tasks in SAGE's binary space with a little exploration (most where its "
                      "fitted Q-values are close) and writes SAGE journals; each night the offline chain (ingest, "
                      "routing dataset, CQL with alpha and SAGE's confidence floor chosen by OPE) retrains on the last "
                      "days' journals, and the gate promotes the served candidate only if the lower bound of its gain "
                      "over the deployed policy (clipped step-wise DR, paired on the same episodes) exceeds "
                      "gate.min_gain of its value and an online A/B against the deployed policy (SAGE's "
                      "compare-policy, common random numbers) confirms the gain is above 0 (gate.confirm_online); "
                      "a promotion is deployed the next day; a significant drop in the logged return restarts the "
                      "window and raises exploration for change.explore_days days. Beside it, on the same tasks: "
                      "the static table forever, the online bandit (SAGE's Tier 1) and the oracle. Per day the true "
                      "value of each; in total cumulative regret, promotions, candidates the online A/B stopped, "
                      "wrong promotions, recovery after each change, and OPE on the bandit's own logs. "
                      "Stationary and/or drifting world. Runs on its own, from nothing, in its own job simulated_month,"
                      " not in make run (a few minutes of CPU per world; benchmarks/closed_loop.py runs it over 20 "
                      "seeds).")
def policy_iteration(context: dg.AssetExecutionContext, config: PolicyIterationConfig,
                     sage: SageResource) -> dg.MaterializeResult:
    bad = [w for w in config.worlds if w not in WORLDS]
    if bad or not config.worlds:
        raise ValueError(f"policy_iteration.worlds {config.worlds}: list 'stationary' and/or 'drifting'")
    meta, report = {}, {}
    # each world's plot and working folder (its simulated journals and nightly ingests) and the report: one set
    members = [f"policy_iteration/{n}" for w in WORLDS for n in (f"{w}.png", f"work/{w}")]
    with sage.writing("policy_iteration", [*members, "policy_iteration/policy_iteration.json"],
                      context.log.info) as stage:
        for world in dict.fromkeys(config.worlds):
            loop = pi.LoopConfig(**to_core(config, pi.MonthConfig).model_dump(),
                                 bandit=BanditConfig(algorithm=config.bandit),
                                 world=pi.WorldConfig(drift=world == "drifting", quality_model=config.quality_model,
                                                      price_model=config.price_model))
            t0 = time.perf_counter()
            res = pi.run_month(loop, work=stage.path("policy_iteration", "work", world), catalogue=sage.catalogue,
                               table=sage.table, progress=lambda m, w=world: context.log.info(f"{w}: {m}"))
            context.log.info(f"{world}: {config.days} days in {time.perf_counter() - t0:.0f} s")
            s = res.summary
            png = pi.plot_days(res.days, f"{world} world: true value by day (seed {config.seed})")
            artifacts.write_bytes(stage.path("policy_iteration", f"{world}.png"), png)
            report[world] = res.to_dict()
            meta |= {
                f"{world}_cumulative_regret": dg.MetadataValue.json(s["cumulative_regret"]),
                f"{world}_nightly_regret_share_of_static": s.get("nightly_regret_share_of_static"),
                f"{world}_promotions": s.get("promotions"), f"{world}_wrong_promotions": s.get("wrong_promotions"),
                f"{world}_offline_gate_passed": s.get("offline_gate_passed"),
                f"{world}_rejected_online": s.get("rejected_online"),
                f"{world}_recovery": dg.MetadataValue.json(s.get("recovery", {})),
                f"{world}_changes_detected": dg.MetadataValue.json(s.get("changes_detected", [])),
                f"{world}_bandit_logs_ope": dg.MetadataValue.json(res.bandit_ope),
                f"{world}_value_by_day": dg.MetadataValue.md(markdown.image(png, f"{world}: true value by day")),
                f"{world}_days": dg.MetadataValue.md(markdown.table([
                    {k: d.get(k) for k in ("day", "oracle", "static_table", "bandit", "nightly", "nightly_deployed",
                                           "promoted", "wrong_promotion", "drop_z", "change_detected")}
                    for d in res.days])),
            }
        path = stage.public(artifacts.write_json(stage.path("policy_iteration", "policy_iteration.json"), report))
    return dg.MaterializeResult(metadata=meta | {"path": dg.MetadataValue.path(str(path)), "seed": config.seed,
                                                 "days": config.days})


policy_iteration_job = dg.define_asset_job(
    "simulated_month", selection=dg.AssetSelection.assets(policy_iteration),
    description="The simulated month alone: deploy -> log -> retrain -> gate -> promote against the static table, "
                "the online bandit and the oracle (benchmarks/closed_loop.py runs it over 20 seeds).")

policy_iteration_defs = dg.Definitions(assets=[policy_iteration], jobs=[policy_iteration_job])
