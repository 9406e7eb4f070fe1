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
    recommend as brec,
    routers as br,
    run as brun,
    train as bt,
)

GROUP = "routing_benchmark"
JOB = "routing_benchmark_job"  # not the group's name: that is the asset's, and an op and a job cannot share it
CHECK = "recommended_router_beats_random_router"
MEMBERS = (f"reports/{brun.REPORT_NAME}", f"reports/{brun.PLOT_NAME}", f"checkpoints/{GROUP}")  # one atomic set


class ImportSection(dg.Config, bi.ImportConfig):
    """``sage_pipeline.routing_benchmark.importer.ImportConfig`` (path and price_table absolute or
    relative to the artifact root)."""


class TfidfSvdSection(dg.Config, bfeat.TfidfSvdConfig):
    """``sage_pipeline.routing_benchmark.prompt_features.TfidfSvdConfig``."""


class OpenAIEmbeddingSection(dg.Config, bfeat.OpenAIEmbeddingConfig):
    """``sage_pipeline.routing_benchmark.prompt_features.OpenAIEmbeddingConfig``."""


class RandomRouterSection(dg.Config, br.RandomRouterConfig):
    """``sage_pipeline.routing_benchmark.routers.RandomRouterConfig``."""


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


class RecommendSection(dg.Config, brec.RecommendConfig):
    """``sage_pipeline.routing_benchmark.recommend.RecommendConfig``."""


class PropensityBCSection(dg.Config, bb.PropensityBCConfig):
    """``sage_pipeline.routing_benchmark.logged_bandit.PropensityBCConfig``."""


def _ope_behaviours() -> list[BehaviourSection]:
    return [BehaviourSection(**b.model_dump()) for b in brun.BenchmarkConfig().ope_behaviours]


class RoutingBenchmarkConfig(dg.Config, brun.BenchmarkConfig):
    """The routing benchmark's run config: ``sage_pipeline.routing_benchmark.run.BenchmarkConfig``,
    section by section (``table``, ``tfidf_svd``, ``openai_embedding``, ``random``, ``regression``, ``predictive``,
    ``knn``, ``bc``, ``cql``, ``train_behaviour``, ``ope_behaviours``, ``ope``, ``propensity_bc``, ``recommend``);
    test_path is absolute or relative to the artifact root."""

    table: ImportSection = section(brun.BenchmarkConfig, "table", ImportSection)
    tfidf_svd: TfidfSvdSection = section(brun.BenchmarkConfig, "tfidf_svd", TfidfSvdSection)
    openai_embedding: OpenAIEmbeddingSection = section(brun.BenchmarkConfig, "openai_embedding",
                                                       OpenAIEmbeddingSection)
    random: RandomRouterSection = section(brun.BenchmarkConfig, "random", RandomRouterSection)
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
    recommend: RecommendSection = section(brun.BenchmarkConfig, "recommend", RecommendSection)


@dg.asset(group_name=GROUP, kinds={"scikitlearn", "pytorch", "json"},
          description="Imports a routing-benchmark outcome table (every prompt x every model's quality and cost; "
                      "default: RouteLLM's MMLU, contaminated prompts excluded), splits it by prompt, and scores "
                      "routers against single models, the zero router, random and the oracle on held-out prompts: "
                      "the per-eval_name lookup, quality-and-cost regression (on the prompt features, and with "
                      "eval_name), predictive MLP and kNN routers, and a recommended router chosen on a "
                      "validation part of the train split (the zero router's hull when nothing beats it); BC and "
                      "bandit CQL for the OPE part. AIQ (RouterBench, pooled and per eval_name), APGR and CPT "
                      "(RouteLLM), OPE estimates vs exact values. Report in reports/routing_benchmark.json, "
                      "routers in checkpoints/routing_benchmark/ (the three switch together).",
          check_specs=[dg.AssetCheckSpec(CHECK, asset="routing_benchmark", blocking=False,
                                         description="Warns unless the recommended router (chosen on validation "
                                                     "prompts, never on the test ones) beats the random router on "
                                                     "the held-out prompts: the paired 95% bootstrap interval of "
                                                     "its AIQ margin lies above 0. The random router's AIQ is its "
                                                     "exact expectation, the zero router's hull: a recommended "
                                                     "zero router ties it (said so), never loses to it.")])
def routing_benchmark(context: dg.AssetExecutionContext, config: RoutingBenchmarkConfig,
                      sage: SageResource) -> dg.MaterializeResult:
    cfg = to_core(config, brun.BenchmarkConfig).under(sage.root())
    result, bundle = brun.run_benchmark(cfg, log=context.log.info)
    with sage.writing(GROUP, MEMBERS, context.log.info) as stage:
        paths, png = brun.write_outputs(result, bundle, stage.path("reports"), stage.path("checkpoints", GROUP),
                                        public=stage.public)
    md, rep, aiq = brun.metadata_markdown(result), result.import_report, result.aiq
    best, rec, margins = result.best_learned, result.recommended, result.recommended_margins
    ci = lambda base, i: margins[base][i] if base in margins else None  # noqa: E731
    return dg.MaterializeResult(
        metadata={"results": dg.MetadataValue.md(md["results"]),
                  "plot": dg.MetadataValue.md(markdown.image(png, "cost-quality curves on held-out prompts")),
                  **{k: dg.MetadataValue.md(md[k]) for k in ("selection", "per_eval", "routellm", "ope", "costs",
                                                             "dropped") if k in md},
                  "dagster/row_count": rep.rows_kept, "models": dg.MetadataValue.json(list(result.models)),
                  "train_prompts": result.n_train, "test_prompts": result.n_test,
                  "dropped_rows": rep.n_dropped, "excluded_prompts": rep.excluded,
                  "dropped_files": len(rep.dropped_files),
                  "dropped_index_columns": dg.MetadataValue.json(rep.dropped_index_columns),
                  "quality_scale": dg.MetadataValue.json(rep.quality_scale),
                  "recommended_router": rec, "recommended_aiq": aiq[brun.RECOMMENDED],
                  "recommended_margins_ci95": dg.MetadataValue.json({b: list(v) for b, v in margins.items()}),
                  "best_learned_router": best, "best_learned_aiq": aiq[best],
                  "random_router_aiq": aiq["random"], "zero_router_aiq": aiq["zero_router"],
                  "eval_lookup_aiq": aiq.get(br.LOOKUP), "oracle_aiq": aiq["oracle"],
                  "aiq_mean_over_eval_name": dg.MetadataValue.json(
                      {n: result.aiq_eval_mean(n) for n in ("recommended", "zero_router", "random", br.LOOKUP)}),
                  "aiq_mean_over_eval_name_ci95": dg.MetadataValue.json(
                      result.eval_intervals.mean if result.eval_intervals else None),
                  "table_sha256": result.table_sha256, "source": str(Path(rep.source)),
                  "path": dg.MetadataValue.path(str(paths["report"])),
                  "checkpoint": dg.MetadataValue.path(str(paths["checkpoint"]))},
        check_results=[dg.AssetCheckResult(
            check_name=CHECK, passed=result.beats_random_router, severity=dg.AssetCheckSeverity.WARN,
            metadata={"recommended_router": rec, "recommended_aiq": aiq[brun.RECOMMENDED],
                      "margin_vs_random_ci95_low": ci("random", 0), "margin_vs_random_ci95_high": ci("random", 1),
                      "margin_vs_zero_router_ci95_low": ci("zero_router", 0),
                      "margin_vs_zero_router_ci95_high": ci("zero_router", 1),
                      "margin_vs_eval_lookup_ci95_low": ci(br.LOOKUP, 0),
                      "margin_vs_eval_lookup_ci95_high": ci(br.LOOKUP, 1),
                      "random_router_aiq": aiq["random"], "zero_router_aiq": aiq["zero_router"],
                      "verdict": result.verdict_vs_random},
            description=f"recommended router {rec}: test AIQ {aiq[brun.RECOMMENDED]:.4f}, paired margin over random "
                        f"[{ci('random', 0):.4f}, {ci('random', 1):.4f}]: it {result.verdict_vs_random} (random, "
                        f"its exact expectation, {aiq['random']:.4f}; zero router {aiq['zero_router']:.4f})")])


routing_benchmark_job = dg.define_asset_job(
    JOB, selection=dg.AssetSelection.groups(GROUP),
    description="The routing benchmark: import an outcome table, train and score routers against ground truth.")

routing_benchmark_defs = dg.Definitions(assets=[routing_benchmark], jobs=[routing_benchmark_job])
