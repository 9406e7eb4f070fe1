"""The routing-benchmark asset: a published full-information outcome table (RouteLLM, RouterBench
or long layout) -> learned routers scored with the field's metrics against exact ground truth."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import dataclasses
from pathlib import Path

import dagster as dg
from pydantic import Field

from sage_pipeline import markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.routing_benchmark import importer as bi, logged_bandit as bb, run as brun
from sage_pipeline.routing_benchmark.routers import DEFAULT_SWEEP_POINTS, DEFAULT_WEIGHT_POINTS
from sage_pipeline.routing_benchmark.train import BCGridConfig

GROUP = "routing_benchmark"
JOB = "routing_benchmark_job"  # not the group's name: that is the asset's, and an op and a job cannot share it
CHECK = "learned_router_beats_random_router"


class RoutingBenchmarkConfig(dg.Config):
    path: str = Field("", description="the table: a file or a folder of *.csv, *.csv.gz, *.parquet (absolute or "
                      "relative to the artifact root); empty: the packaged RouteLLM MMLU outcomes")
    layout: str = Field("auto", description="auto, routellm, routerbench (wide) or long")
    models: list[str] = Field([], description="the table's models; empty: those of the first file")
    exclude_prompts: str = Field("auto", description="JSON lines of prompts to exclude (RouteLLM's "
                                 "contaminated_prompts.jsonl); 'auto': that file beside the table if present; '': none")
    price_table: str = Field("", description="YAML price table for costs the table lacks; empty: the packaged one")
    default_cost_per_call: float | None = Field(None, description="USD per call for a model with neither a "
                                                   "cost column nor a price; unset: such a model is an error")
    quality_scale: str = Field("auto", description="the quality's declared scale: auto (RouteLLM: binary; "
                               "RouterBench and long: [0, 1]), binary, unit or LO..HI (e.g. 1..10); a quality "
                               "outside it stops the import naming file, row and column")
    strict: bool = Field(False, description="fail at the first bad row or file instead of dropping and reporting it")
    split: str = Field("hash", description="hash: hold out test_fraction of the prompts by a hash of their text; "
                       "given: the table's own split, test_path's prompts or else the table's split column "
                       "(train / test)")
    test_path: str = Field("", description="split given: the test table (file or folder, same layout options; "
                           "relative to the artifact root); path is then the train table")
    embedding: str = Field("", description="precomputed prompt embeddings: a column holding a list of numbers, or "
                           "a prefix ending in '*' (emb_*) naming one column per dimension; used by featurizer "
                           "embedding")
    test_fraction: float = Field(0.25, description="share of prompts held out for testing (by prompt hash)")
    seed: int = 0
    featurizer: str = Field("tfidf_svd", description="prompt features: tfidf_svd, length, embedding (the table's "
                            "precomputed embeddings: set embedding) or one registered")
    n_components: int = Field(128, description="tfidf_svd: SVD dimensions")
    cost_weight_points: int = Field(DEFAULT_WEIGHT_POINTS, description="cost weights the BC and CQL routers "
                                    "are trained for: 0 to the weight that sends every train prompt to its cheapest "
                                    "model, at quantiles of the weights where the oracle's choice changes")
    sweep_points: int = Field(DEFAULT_SWEEP_POINTS, description="cost weights each prediction-based router is "
                              "swept over on the test prompts (0 to its own cheap end)")
    bc_steps: int = Field(600, description="gradient steps of the BC policies (all cost weights at once)")
    cql_steps: int = Field(600, description="gradient steps of the bandit CQL critics")
    cql_alpha: float = Field(0.03, description="CQL's conservative weight")
    train_behaviour: str = Field("uniform", description="behaviour that logs CQL's training feedback: static, "
                                 "uniform or epsilon")
    behaviour_model: str = Field("", description="the static / epsilon behaviour's model; empty: the dearest")
    epsilon: float = Field(0.3, description="exploration of the epsilon behaviour")
    ope_behaviours: list[str] = Field(["static", "uniform", "epsilon"], description="behaviours simulated on the "
                                      "test prompts for off-policy evaluation")
    ope_multiplier: float = Field(0.1, description="the cost weight OPE evaluates at, in units of 1 / (median "
                                  "per-prompt cost spread between the dearest and cheapest model)")
    n_boot: int = Field(200, description="bootstrap resamples per OPE interval and for the routers' AIQ "
                        "intervals (resamples of the test prompts)")


def _benchmark_config(c: RoutingBenchmarkConfig, sage: SageResource) -> brun.BenchmarkConfig:
    def spec(kind: str) -> bb.BehaviourSpec:
        return bb.BehaviourSpec(kind, c.behaviour_model or None, c.epsilon)

    table = bi.ImportConfig(
        path=sage.root() / c.path if c.path else bi.DEFAULT_TABLE, layout=c.layout, models=tuple(c.models),
        exclude_prompts=c.exclude_prompts, price_table=sage.root() / c.price_table if c.price_table
        else bi.DEFAULT_PRICES, default_cost_per_call=c.default_cost_per_call, strict=c.strict,
        quality_scale=c.quality_scale, embedding=c.embedding)
    test = dataclasses.replace(table, path=sage.root() / c.test_path) if c.test_path else None
    return brun.BenchmarkConfig(
        table=table, split=c.split, test_table=test, test_fraction=c.test_fraction, seed=c.seed,
        featurizer=c.featurizer,
        featurizer_params={"n_components": c.n_components} if c.featurizer == "tfidf_svd" else {},
        weight_points=c.cost_weight_points, sweep_points=c.sweep_points, bc=BCGridConfig(steps=c.bc_steps, seed=c.seed),
        cql=CQLConfig(mode="bandit", hidden=(16,), steps=c.cql_steps, alpha=c.cql_alpha, seed=c.seed),
        train_behaviour=spec(c.train_behaviour), ope_behaviours=tuple(spec(k) for k in c.ope_behaviours),
        ope_multiplier=c.ope_multiplier, ope=bb.BanditOPEConfig(n_boot=c.n_boot, seed=c.seed), aiq_boot=c.n_boot)


@dg.asset(group_name=GROUP, kinds={"scikitlearn", "pytorch", "json"},
          description="Imports a routing-benchmark outcome table (every prompt x every model's quality and cost; "
                      "default: RouteLLM's MMLU, contaminated prompts excluded), splits it by prompt, and scores "
                      "learned routers (quality-and-cost regression, predictive MLP and kNN routers, cost-sensitive "
                      "BC, bandit CQL on simulated "
                      "logs) against single models, the zero router, random and the oracle on held-out prompts: "
                      "AIQ (RouterBench), APGR and CPT (RouteLLM), OPE estimates vs exact values. Report in "
                      "reports/routing_benchmark.json, routers in checkpoints/routing_benchmark/.",
          check_specs=[dg.AssetCheckSpec(CHECK, asset="routing_benchmark", blocking=False,
                                         description="Warns unless the best learned router's AIQ beats the "
                                                     "random router's on the held-out prompts with 95% "
                                                     "confidence: its bootstrap interval (resampling the test "
                                                     "prompts) lies above the random router's AIQ, and so does "
                                                     "the paired interval of its margin.")])
def routing_benchmark(context: dg.AssetExecutionContext, config: RoutingBenchmarkConfig,
                      sage: SageResource) -> dg.MaterializeResult:
    result, bundle = brun.run_benchmark(_benchmark_config(config, sage), log=context.log.info)
    paths, png = brun.write_outputs(result, bundle, sage.path("reports"), sage.path("checkpoints", GROUP))
    md, rep, aiq = brun.metadata_markdown(result), result.import_report, result.aiq
    best = result.best_learned
    return dg.MaterializeResult(
        metadata={"results": dg.MetadataValue.md(md["results"]),
                  "plot": dg.MetadataValue.md(markdown.image(png, "cost-quality curves on held-out prompts")),
                  **{k: dg.MetadataValue.md(md[k]) for k in ("routellm", "ope", "costs", "dropped") if k in md},
                  "dagster/row_count": rep.rows_kept, "models": dg.MetadataValue.json(list(result.models)),
                  "train_prompts": result.n_train, "test_prompts": result.n_test,
                  "dropped_rows": rep.n_dropped, "excluded_prompts": rep.excluded,
                  "dropped_files": len(rep.dropped_files),
                  "dropped_index_columns": dg.MetadataValue.json(rep.dropped_index_columns),
                  "quality_scale": dg.MetadataValue.json(rep.quality_scale), "best_learned_router": best,
                  "best_learned_aiq": aiq[best],
                  "best_learned_aiq_ci95": dg.MetadataValue.json(list(result.aiq_ci[best])),
                  "random_router_aiq": aiq["random"], "zero_router_aiq": aiq["zero_router"],
                  "oracle_aiq": aiq["oracle"],
                  "table_sha256": result.table_sha256, "source": str(Path(rep.source)),
                  "path": dg.MetadataValue.path(str(paths["report"])),
                  "checkpoint": dg.MetadataValue.path(str(paths["checkpoint"]))},
        check_results=[dg.AssetCheckResult(
            check_name=CHECK, passed=result.beats_random_router, severity=dg.AssetCheckSeverity.WARN,
            metadata={"best_learned_router": best, "best_learned_aiq": aiq[best],
                      "best_learned_aiq_ci95_low": result.aiq_ci[best][0],
                      "best_learned_aiq_ci95_high": result.aiq_ci[best][1],
                      "margin_vs_random_ci95_low": result.margin_vs_random_ci[best][0],
                      "margin_vs_random_ci95_high": result.margin_vs_random_ci[best][1],
                      "random_router_aiq": aiq["random"], "zero_router_aiq": aiq["zero_router"]},
            description=f"{best} AIQ {aiq[best]:.4f} (95% interval [{result.aiq_ci[best][0]:.4f}, "
                        f"{result.aiq_ci[best][1]:.4f}]) vs random router {aiq['random']:.4f}")])


routing_benchmark_job = dg.define_asset_job(
    JOB, selection=dg.AssetSelection.groups(GROUP),
    description="The routing benchmark: import an outcome table, train and score routers against ground truth.")

routing_benchmark_defs = dg.Definitions(assets=[routing_benchmark], jobs=[routing_benchmark_job])
