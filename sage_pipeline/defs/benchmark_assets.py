"""The routing-benchmark asset: a published full-information outcome table (RouteLLM, RouterBench
or long layout) -> learned routers scored with the field's metrics against exact ground truth."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

from pathlib import Path

import dagster as dg
from pydantic import Field

from sage_pipeline import markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import section, to_core
from sage_pipeline.routing_benchmark import (
    importer as bi,
    logged_bandit as bb,
    prompt_features as bfeat,
    routers as br,
    run as brun,
    train as bt,
)

GROUP = "routing_benchmark"
JOB = "routing_benchmark_job"  # not the group's name: that is the asset's, and an op and a job cannot share it
CHECK = "learned_router_beats_random_router"


class ImportSection(dg.Config, bi.ImportConfig):
    """``sage_pipeline.routing_benchmark.importer.ImportConfig`` (path and price_table absolute or
    relative to the artifact root)."""


class TfidfSvdSection(dg.Config, bfeat.TfidfSvdConfig):
    """``sage_pipeline.routing_benchmark.prompt_features.TfidfSvdConfig``."""


class RegressionSection(dg.Config, br.RegressionConfig):
    """``sage_pipeline.routing_benchmark.routers.RegressionConfig``."""


class PredictiveSection(dg.Config, br.PredictiveConfig):
    """``sage_pipeline.routing_benchmark.routers.PredictiveConfig``."""


class KNNSection(dg.Config, br.KNNConfig):
    """``sage_pipeline.routing_benchmark.routers.KNNConfig``."""


class BCGridSection(dg.Config, bt.BCGridConfig):
    """``sage_pipeline.routing_benchmark.train.BCGridConfig``."""


class CQLSection(dg.Config, bt.BenchmarkCQLConfig):
    """``sage_pipeline.routing_benchmark.train.BenchmarkCQLConfig``: ``rl.cql.CQLConfig`` with the
    benchmark's defaults."""


class BehaviourSection(dg.Config, bb.BehaviourSpec):
    """``sage_pipeline.routing_benchmark.logged_bandit.BehaviourSpec``."""


class BanditOPESection(dg.Config, bb.BanditOPEConfig):
    """``sage_pipeline.routing_benchmark.logged_bandit.BanditOPEConfig``."""


class PropensityBCSection(dg.Config, bb.PropensityBCConfig):
    """``sage_pipeline.routing_benchmark.logged_bandit.PropensityBCConfig``."""


def _ope_behaviours() -> list[BehaviourSection]:
    return [BehaviourSection(**b.model_dump()) for b in brun.BenchmarkConfig().ope_behaviours]


class RoutingBenchmarkConfig(dg.Config, brun.BenchmarkConfig):
    """The routing benchmark's run config: ``sage_pipeline.routing_benchmark.run.BenchmarkConfig``,
    section by section (``table``, ``tfidf_svd``, ``regression``, ``predictive``, ``knn``, ``bc``,
    ``cql``, ``train_behaviour``, ``ope_behaviours``, ``ope``, ``propensity_bc``); test_path is
    absolute or relative to the artifact root."""

    table: ImportSection = section(brun.BenchmarkConfig, "table", ImportSection)
    tfidf_svd: TfidfSvdSection = section(brun.BenchmarkConfig, "tfidf_svd", TfidfSvdSection)
    regression: RegressionSection = section(brun.BenchmarkConfig, "regression", RegressionSection)
    predictive: PredictiveSection = section(brun.BenchmarkConfig, "predictive", PredictiveSection)
    knn: KNNSection = section(brun.BenchmarkConfig, "knn", KNNSection)
    bc: BCGridSection = section(brun.BenchmarkConfig, "bc", BCGridSection)
    cql: CQLSection = section(brun.BenchmarkConfig, "cql", CQLSection)
    train_behaviour: BehaviourSection = section(brun.BenchmarkConfig, "train_behaviour", BehaviourSection)
    ope_behaviours: list[BehaviourSection] = Field(
        default_factory=_ope_behaviours, description=brun.BenchmarkConfig.model_fields["ope_behaviours"].description)
    ope: BanditOPESection = section(brun.BenchmarkConfig, "ope", BanditOPESection)
    propensity_bc: PropensityBCSection = section(brun.BenchmarkConfig, "propensity_bc", PropensityBCSection)


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
    cfg = to_core(config, brun.BenchmarkConfig).under(sage.root())
    result, bundle = brun.run_benchmark(cfg, log=context.log.info)
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
