"""The routing benchmark end to end: import -> split -> features -> routers -> metrics -> OPE -> report.

:func:`run_benchmark` is what the ``routing_benchmark`` asset calls:

1. import the table (:mod:`importer`), split it into train and test *by prompt*
   (``split: hash``: a stable hash of the prompt text, so a duplicated text never straddles
   the split; ``split: given``: the table's own split, from a test table or a split column);
2. fit the prompt featurizer on the train prompts only (:mod:`prompt_features`);
3. baselines and routers (:mod:`routers`) on the train split: the regression,
   predictive (MLP) and kNN routers and BC on the full table, bandit CQL on logged feedback
   simulated from it (:mod:`logged_bandit`, ``train_behaviour``);
4. on the held-out test prompts, every router's cost-quality curve over cost weights from 0
   to its cheap end, its AIQ with a 95% bootstrap interval and its paired margin over the
   random router (its exact expectation: the zero router's hull; single draws, each scored on its
   own path, give its spread), AIQ per eval_name and their mean with 95% intervals from a bootstrap
   within each eval, and for two-model tables RouteLLM's APGR and CPT(50%)/CPT(80%) (:mod:`metrics`);
5. logs simulated on the test prompts under each ``ope_behaviours`` policy, and every
   estimator of ``rl.ope`` for each learned router at one cost weight, next to its exact
   value (with logged propensities, and with propensities estimated by BC).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline import artifacts, markdown
from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.routing_benchmark import (
    logged_bandit as bb,
    metrics as bm,
    prompt_features as bfeat,
    recommend as brec,
    routers as br,
    train as bt,
)
from sage_pipeline.routing_benchmark.importer import (
    BenchmarkImportError,
    BenchmarkTable,
    ImportConfig,
    ImportReport,
    PathText,
    import_benchmark,
)

logger = logging.getLogger(__name__)

LEARNED = ("regression", "predictive", "knn", br.META)  # table routers (regression_meta: tables with 2+ evals)
# BC and CQL train on the per-prompt oracle's choice and on simulated bandit feedback: kept for the OPE part,
# not offered as table routers (see OFFLINE_RL_NOTE)
OFFLINE_RL = ("bc", "cql")
OFFLINE_RL_KIND = "offline RL (OPE only; not a table router)"
OFFLINE_RL_NOTE = (
    "BC imitates the per-prompt oracle: its label is the cheapest model that happened to answer that prompt "
    "well, which with many models is most often a cheap one, so it learns where luck fell, not each model's "
    "expected quality; bandit CQL sees one model's outcome per prompt. Both are kept for the off-policy "
    "evaluation (they are the policies the OPE estimators judge), and never recommended.")
REPORT_NAME = "routing_benchmark.json"
PLOT_NAME = "routing_benchmark.png"


class BenchmarkConfig(BaseModel):
    """Everything one benchmark run is made with (the routing_benchmark asset's config is this
    model, section by section)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: ImportConfig = Field(default_factory=ImportConfig, description="the table and how to import it")
    split: Literal["hash", "given"] = Field(
        "hash", description="hash: hold out test_fraction of the prompts by a stable hash of their text; given: the "
                            "table's own split, test_path's prompts (train: table's) or else the table's split column "
                            "(train / test)")
    test_path: PathText | None = Field(None, min_length=1, description="split given: the test table (a file or "
                                       "folder, read with table's options); table is then the train table")
    test_fraction: float = Field(0.25, gt=0.0, lt=1.0, description="share of prompts held out for testing (by a "
                                 "stable hash of the prompt), in (0, 1)")
    seed: int = Field(0, description="seed of the hash split, the random router's draws, the bootstraps and the "
                               "simulated logs")
    featurizer: str = Field("tfidf_svd", description="prompt features: tfidf_svd, length, embedding (the table's "
                            "precomputed embeddings: set table.embedding), openai_embedding (an OpenAI-compatible "
                            "endpoint: set openai_embedding) or one registered (register_featurizer)")
    tfidf_svd: bfeat.TfidfSvdConfig = Field(default_factory=bfeat.TfidfSvdConfig, description="the tfidf_svd "
                                            "featurizer's settings (used when featurizer is tfidf_svd)")
    openai_embedding: bfeat.OpenAIEmbeddingConfig = Field(
        default_factory=bfeat.OpenAIEmbeddingConfig, description="an OpenAI-compatible embeddings endpoint (used "
                                                                 "when featurizer is openai_embedding)")
    weight_points: int = Field(br.DEFAULT_WEIGHT_POINTS, ge=2, description="cost weights the BC and CQL routers are "
                               "trained for: 0 to the weight that sends every train prompt to its cheapest model, at "
                               "quantiles of the weights where the oracle's choice changes (>= 2)")
    sweep_points: int = Field(br.DEFAULT_SWEEP_POINTS, ge=2, description="cost weights each prediction-based router "
                              "is swept over on the test prompts, 0 to its own cheap end (>= 2)")
    random: br.RandomRouterConfig = Field(default_factory=br.RandomRouterConfig, description="the random router's "
                                          "curve (its exact expectation) and the draws that show its spread")
    regression: br.RegressionConfig = Field(default_factory=br.RegressionConfig, description="the regression router")
    predictive: br.PredictiveConfig = Field(default_factory=br.PredictiveConfig, description="the predictive router")
    knn: br.KNNConfig = Field(default_factory=br.KNNConfig, description="the kNN router")
    bc: bt.BCGridConfig = Field(default_factory=bt.BCGridConfig, description="the BC grid router's training")
    cql: CQLConfig = Field(default_factory=bt.BenchmarkCQLConfig, description="the bandit CQL grid router's "
                           "training (default: BenchmarkCQLConfig's small bandit critics)")
    train_behaviour: bb.BehaviourSpec = Field(default_factory=bb.BehaviourSpec, description="the behaviour that "
                                              "logs CQL's training feedback")
    ope_behaviours: list[bb.BehaviourSpec] = Field(
        default_factory=lambda: [bb.BehaviourSpec(kind="static"), bb.BehaviourSpec(kind="uniform"),
                                 bb.BehaviourSpec(kind="epsilon", epsilon=0.3)],
        description="behaviours simulated on the test prompts for off-policy evaluation")
    # on MMLU 0.1 sends about half the prompts to each model (at 1 every router sends all to the cheap one)
    ope_multiplier: float = Field(0.1, ge=0.0, description="the cost weight OPE evaluates the routers at, in units "
                                  "of 1 / (median per-prompt cost spread between the dearest and cheapest model)")
    recommend: brec.RecommendConfig = Field(default_factory=brec.RecommendConfig, description="how the recommended "
                                            "router is chosen, on a validation part of the train split")
    aiq_boot: int = Field(200, ge=1, description="bootstrap resamples of the test prompts for every router's AIQ "
                          "interval (paired across routers), pooled and within each eval_name")
    ope: bb.BanditOPEConfig = Field(default_factory=bb.BanditOPEConfig, description="the OPE estimators")
    propensity_bc: bb.PropensityBCConfig = Field(default_factory=bb.PropensityBCConfig, description="propensities "
                                                 "estimated by behaviour cloning")
    # One is fastest on a shared 2-core host: the TF-IDF + SVD fit took 3.8 s with 1 thread, 14.7 s with 2 (load ~8)
    blas_threads: int = Field(1, ge=0, description="BLAS/OpenMP threads (numpy, scikit-learn) while it runs; 0 "
                              "leaves the default")

    @model_validator(mode="after")
    def _test_path_needs_given(self) -> BenchmarkConfig:
        if self.test_path is not None and self.split != "given":
            raise ValueError("a test table is only read with split='given' (set split: given, or drop test_path)")
        return self

    def under(self, root: str | os.PathLike[str]) -> BenchmarkConfig:
        """This config with the table's and the test table's relative paths resolved against ``root``."""
        test = {} if self.test_path is None else {"test_path": str(Path(root) / self.test_path)}
        return self.model_copy(update={"table": self.table.under(root)} | test)


EVAL_HEADS = ("recommended", "zero_router", "random", br.LOOKUP, "oracle")  # the per-eval table's routers
MARGIN_BASELINES = ("zero_router", "random", br.LOOKUP)  # the recommended router's paired differences
NAMED_EVALS = 12  # evals named in the headline, at most (the per_eval table lists every one)


def _ci95(v: np.ndarray) -> tuple[float, float]:
    return tuple(np.percentile(v, [2.5, 97.5]).tolist())


@dataclass(frozen=True)
class EvalIntervals:
    """95% intervals of the per-eval_name AIQ: each eval's test prompts resampled on their own (paired across
    routers within an eval); the headline's (the mean over evals) from the same resamples, each eval's
    independent of the others'."""

    prompts: dict[str, int]  # eval -> test prompts
    aiq: dict[str, dict[str, tuple[float, float]]]  # eval -> router -> interval
    margins: dict[str, dict[str, tuple[float, float]]]  # eval -> baseline -> interval of recommended - baseline
    mean: dict[str, tuple[float, float]]  # router -> interval of its mean over evals
    mean_margins: dict[str, tuple[float, float]]  # baseline -> interval of the mean's recommended - baseline

    @classmethod
    def from_boot(cls, boot: dict[str, dict[str, np.ndarray]], prompts: dict[str, int]) -> EvalIntervals:
        mean = {n: np.mean([b[n] for b in boot.values() if n in b], axis=0)
                for n in EVAL_HEADS if any(n in b for b in boot.values())}
        return cls(prompts, {e: {n: _ci95(v) for n, v in b.items()} for e, b in boot.items()},
                   {e: {base: _ci95(b[RECOMMENDED] - b[base]) for base in MARGIN_BASELINES if base in b}
                    for e, b in boot.items() if RECOMMENDED in b},
                   {n: _ci95(v) for n, v in mean.items()},
                   {base: _ci95(mean[RECOMMENDED] - mean[base]) for base in MARGIN_BASELINES
                    if RECOMMENDED in mean and base in mean})

    def not_separated(self, base: str) -> list[str]:
        """The evals whose paired interval of recommended - ``base`` includes 0: their prompts cannot tell the
        two apart."""
        return [e for e, m in self.margins.items() if base in m and m[base][0] <= 0.0 <= m[base][1]]

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "aiq_ci95": self.aiq, "recommended_margins_ci95": self.margins,
                "mean_ci95": self.mean, "mean_recommended_margins_ci95": self.mean_margins,
                "not_separated": {b: self.not_separated(b) for b in MARGIN_BASELINES}}


@dataclass
class BenchmarkResult:
    models: tuple[str, ...]
    n_train: int
    n_test: int
    cost_scale: float
    weights: np.ndarray
    c_range: tuple[float, float]
    curves: dict[str, bm.Curve]
    kinds: dict[str, str]  # curve -> "single model" / "baseline" / "learned"
    aiq: dict[str, float]  # RouterBench's paper: mean NDCH quality over [c_min, c_max]
    aiq_code: dict[str, float]  # RouterBench's calc_AIQ: area from the router's first point / x_max
    routellm: dict[str, bm.RouteLLMMetrics]  # two-model tables only
    strong_weak: tuple[str, str] | None
    ope_rows: list[dict]
    ope_weight: float
    propensity: dict[str, dict]
    import_report: ImportReport
    table_sha256: str
    timings: dict[str, float]
    config: BenchmarkConfig
    router_metrics: dict[str, dict] = field(default_factory=dict)
    split_info: dict = field(default_factory=dict)
    aiq_by_eval: dict[str, dict[str, float]] = field(default_factory=dict)  # eval_name -> router -> AIQ
    selection: brec.Selection | None = None  # how the recommended router was chosen (validation prompts)
    recommended_margins: dict[str, tuple[float, float]] = field(default_factory=dict)  # paired, on test: AIQ - base

    def gap_closed(self, name: str) -> float:
        """Share of the gap from the best single model (by test quality) to the oracle that ``name``
        closes at that model's cost."""
        best = max(self.models, key=lambda m: self.curves[m].quality[0])
        b, o, c = self.curves[best], self.curves["oracle"], self.curves[name]
        return bm.gap_closed(c.cost, c.quality, float(b.cost[0]), float(b.quality[0]), o.cost, o.quality)

    def aiq_eval_mean(self, name: str) -> float | None:
        """The mean of a router's per-eval_name AIQ (RouterBench's average), over the evals it has."""
        vals = [v[name] for v in self.aiq_by_eval.values() if name in v]
        return float(np.mean(vals)) if vals else None
    aiq_ci: dict[str, tuple[float, float]] = field(default_factory=dict)  # 95% bootstrap interval over test prompts
    margin_vs_random_ci: dict[str, tuple[float, float]] = field(default_factory=dict)  # paired: AIQ - random's
    random_router: dict = field(default_factory=dict)  # how random's AIQ was found, and its draws' spread
    eval_intervals: EvalIntervals | None = None  # per-eval_name intervals (bootstrap within each eval)

    @property
    def learned(self) -> tuple[str, ...]:
        return tuple(n for n in self.curves if self.kinds.get(n) == "learned")

    @property
    def best_learned(self) -> str:
        return max(self.learned, key=lambda n: self.aiq.get(n, -np.inf))

    @property
    def beats_zero_router(self) -> bool:
        return self.aiq[self.best_learned] > self.aiq["zero_router"]

    @property
    def recommended(self) -> str:
        """The router the validation prompts chose (``recommended`` is its test curve)."""
        return self.selection.recommended if self.selection else "zero_router"

    @property
    def beats_random_router(self) -> bool:
        """The recommended router (chosen without the test prompts) beats the random router on them: the
        paired 95% interval of its AIQ margin lies above 0 (bootstrap over the test prompts)."""
        ci = self.recommended_margins.get("random")
        return ci is not None and ci[0] > 0

    @property
    def verdict_vs_random(self) -> str:
        """The recommended router against the random router, in words. The random router's AIQ is its exact
        expectation, the zero router's hull: when that hull is recommended it ties random, it never loses."""
        if self.recommended == "zero_router":
            return ("is the zero router's hull, which the random router equals in expectation: it ties the random "
                    "router (no learned router beat the zero router on the validation prompts)")
        ci = self.recommended_margins.get("random")
        if ci is None:
            return "was not compared with the random router"
        if ci[0] > 0:
            return "beats the random router"
        if ci[1] < 0:
            return "is below the random router (the zero router's hull)"
        return "is not separated from the random router (its paired interval includes 0)"

    @property
    def not_below_zero_router(self) -> bool:
        """The recommended router's paired margin over the zero router's hull is not entirely below 0."""
        ci = self.recommended_margins.get("zero_router")
        return ci is not None and ci[1] >= 0

    def results_rows(self) -> list[dict]:
        rows = []
        for name, c in self.curves.items():
            m = self.routellm.get(name)
            best = int(np.argmax(c.quality))
            rows.append({"router": name, "kind": self.kinds[name], "AIQ": self.aiq[name],
                         "AIQ - zero router": self.aiq[name] - self.aiq["zero_router"],
                         "AIQ 95% interval": _fmt_ci(self.aiq_ci.get(name)),
                         "AIQ - random (95% interval)": _fmt_ci(self.margin_vs_random_ci.get(name)),
                         "AIQ (RouterBench code)": self.aiq_code[name],
                         "AIQ mean over eval_name": self.aiq_eval_mean(name),
                         "gap closed at the best model's cost": self.gap_closed(name),
                         "APGR": m.apgr if m else None, "CPT(50%)": m.cpt50 if m else None,
                         "CPT(80%)": m.cpt80 if m else None, "points": len(c.cost),
                         "best quality": float(c.quality[best]), "its cost (USD/prompt)": float(c.cost[best])})
        return rows

    def ope_table(self) -> list[dict]:
        """One row per (behaviour, policy, propensities): truth and each estimator with its interval."""
        out: dict[tuple, dict] = {}
        for r in self.ope_rows:
            key = (r["behaviour"], r["policy"], r["propensities"])
            row = out.setdefault(key, {"behaviour": key[0], "policy": key[1], "propensities": key[2],
                                       "truth": r["truth"], "ess": r["ess"]})
            if r["note"]:
                row["note"] = r["note"]
            else:
                row[r["estimator"]] = f"{r['estimate']:.4f} [{r['low']:.4f}, {r['high']:.4f}]"
        return list(out.values())

    def to_dict(self) -> dict:
        return br._jsonable({
            "models": list(self.models), "n_train": self.n_train, "n_test": self.n_test,
            "table_sha256": self.table_sha256, "cost_scale_usd": self.cost_scale,
            "cost_weights": self.weights, "aiq_cost_range": list(self.c_range),
            "aiq_normalisation": {"AIQ": "RouterBench paper: integral of the NDCH over [c_min, c_max] / (c_max - "
                                         "c_min), 0 left of the router's first point",
                                  "AIQ (RouterBench code)": "RouterBench evaluation/AIQ.py calc_AIQ: trapezoid "
                                         "area of the NDCH from the router's first point to x_max / x_max"},
            "results": self.results_rows(), "best_learned": self.best_learned,
            "recommended": {"router": self.recommended, "test_aiq": self.aiq.get(RECOMMENDED),
                            "margins_ci95": {b: list(v) for b, v in self.recommended_margins.items()},
                            "selection": self.selection.to_dict() if self.selection else None,
                            "not_below_zero_router": self.not_below_zero_router},
            "offline_rl_note": OFFLINE_RL_NOTE,
            "beats_zero_router": self.beats_zero_router, "beats_random_router": self.beats_random_router,
            "verdict_vs_random": self.verdict_vs_random, "random_router": self.random_router,
            "aiq_ci95": self.aiq_ci, "aiq_by_eval_name": self.aiq_by_eval,
            "aiq_mean_over_eval_name": {n: self.aiq_eval_mean(n) for n in self.curves},
            "aiq_by_eval_name_intervals": self.eval_intervals.to_dict() if self.eval_intervals else None,
            "margin_vs_random_ci95": self.margin_vs_random_ci,
            "curves": {n: {"cost": c.cost, "quality": c.quality, "knob": c.knob, "share": c.share}
                       for n, c in self.curves.items()},
            "routellm": {"strong": self.strong_weak[0] if self.strong_weak else None,
                         "weak": self.strong_weak[1] if self.strong_weak else None,
                         "metrics": {n: {"apgr": m.apgr, "cpt50": m.cpt50, "cpt80": m.cpt80,
                                         "strong_share": m.strong_share, "quality": m.quality}
                                     for n, m in self.routellm.items()},
                         "published_mmlu": bm.ROUTELLM_MMLU_PUBLISHED},
            "ope": {"cost_weight": self.ope_weight, "rows": self.ope_rows, "table": self.ope_table()},
            "propensity_bc": self.propensity, "router_metrics": self.router_metrics,
            "import": self.import_report.to_dict(), "split": self.split_info, "timings_s": self.timings,
            "config": _config_dict(self.config),
        })


def _fmt_ci(ci: tuple[float, float] | None) -> str | None:
    return None if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def _config_dict(cfg: BenchmarkConfig) -> dict:
    return cfg.model_dump()


def split_test(table: BenchmarkTable, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean test mask from a stable, seeded hash of each prompt's text (ids where no text)."""
    h = pd.util.hash_array(table.group_key().astype(object), hash_key=f"{seed:016d}"[-16:])
    return (h % np.uint64(1_000_000)).astype(np.float64) / 1e6 < test_fraction


def given_split(tab: BenchmarkTable, report: ImportReport, cfg: BenchmarkConfig,
                log: Callable[[str], None]) -> tuple[BenchmarkTable, np.ndarray, dict]:
    """The table's own train/test split: ``cfg.test_path`` (imported with the train table's options and models)
    or the ``split`` column. Test prompts whose text is also a train prompt are dropped (reported)."""
    info: dict = {"split": "given"}
    if cfg.test_path is not None:
        te, te_report = import_benchmark(cfg.table.model_copy(update={"path": cfg.test_path,
                                                                      "models": list(tab.models)}), log)
        info |= {"train_source": report.source, "test_source": te_report.source, "test_import": te_report.to_dict()}
        joined = tab.concat(te)
        test = np.concatenate([np.zeros(len(tab), dtype=bool), np.ones(len(te), dtype=bool)])
    else:
        if tab.split is None:
            raise BenchmarkImportError(report.source, "split: given needs a test table (test_path) or a 'split' "
                                                      "column, and the table has neither", column="split",
                                       fix="set test_path to the test file or folder, add a split column "
                                           "(train / test), or use split: hash")
        value = pd.Series(tab.split).str.strip().str.lower().to_numpy()
        bad = ~np.isin(value, ["train", "test"])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BenchmarkImportError(tab.files[tab.file[i]], f"split {tab.split[i]!r} is neither train nor test "
                                                               f"({int(bad.sum())} such rows)",
                                       row=int(tab.row[i]), column="split",
                                       fix="every row needs split train or test (map validation rows to one of "
                                           "them), or use split: hash")
        joined, test = tab, value == "test"
        info["source"] = f"{report.source}: split column"
    key = joined.group_key()
    leaked = test & np.isin(key, key[~test])
    info["test_prompts_also_in_train_dropped"] = int(leaked.sum())
    if leaked.any():
        log(f"routing benchmark: {int(leaked.sum())} test prompts are also train prompts: dropped from the test set")
        keep = np.flatnonzero(~leaked)
        joined, test = joined.take(keep), test[keep]
    return joined, test, info


def run_benchmark(cfg: BenchmarkConfig | None = None, log: Callable[[str], None] = logger.info,
                  table: tuple[BenchmarkTable, ImportReport] | None = None) -> tuple[BenchmarkResult, br.RouterBundle]:
    """The whole benchmark (see the module docstring); ``table`` skips the import."""
    from threadpoolctl import threadpool_limits

    cfg = cfg or BenchmarkConfig()
    with threadpool_limits(limits=cfg.blas_threads or None):
        return _run(cfg, log, table)


def _run(cfg: BenchmarkConfig, log: Callable[[str], None],
         table: tuple[BenchmarkTable, ImportReport] | None) -> tuple[BenchmarkResult, br.RouterBundle]:
    laps = _Laps()
    tab, report = table if table is not None else import_benchmark(cfg.table, log)
    if len(tab.models) < 2:
        raise ValueError(f"{report.source}: a routing benchmark needs at least 2 models, got {list(tab.models)}")
    laps.lap("import")
    tab, tr, te, split_info = split_prompts(tab, report, cfg, log)
    log(f"routing benchmark: {len(tr):,} train / {len(te):,} test prompts, models {list(tab.models)}")
    fx = fit_features(tr, te, cfg, report.source)
    laps.lap("features")
    scale = br.cost_scale(tr.cost)
    weights = br.cost_weights(tr.quality, tr.cost, cfg.weight_points)
    curves, kinds = baseline_curves(te, tab.models, cfg.random)
    routers = train_routers(tr, fx, weights, tab.models, cfg, log, laps.lap)
    pred = predict_test(routers, tr, fx)
    curves |= learned_curves(routers, pred, fx, te, weights, cfg.sweep_points)
    kinds |= {"cost_only": "baseline (price only)"} | {n: "learned" for n in LEARNED} | {
        n: OFFLINE_RL_KIND for n in OFFLINE_RL}
    selection = brec.choose(fx.x_tr, tr.eval_name, tr.quality, tr.cost, fx.chars_tr, tr.group_key(), tab.models,
                            {"regression": cfg.regression, "predictive": cfg.predictive, "knn": cfg.knn},
                            cfg.recommend, cfg.sweep_points, cfg.seed, log)
    full = brec.fit_candidates(fx.x_tr, tr.eval_name, tr.quality, tr.cost, fx.chars_tr, tab.models, cfg.regression,
                               cfg.predictive, cfg.knn, trained={"regression": routers.regression,
                                                                 "predictive": routers.predictive, "knn": routers.knn})
    meta_curves = recommended_curves(full, selection, fx, te, curves, cfg)
    curves |= meta_curves
    kinds |= {br.LOOKUP: "baseline (eval_name lookup)", br.META: "learned", RECOMMENDED: "recommended"}
    laps.lap("recommend")
    scores = score_curves(curves, te, cfg)
    routellm, strong_weak = routellm_scores(routers, pred, fx, tab.models, tr, te, log)
    laps.lap("metrics")
    w_ope = cfg.ope_multiplier / scale
    ope_rows, propensity = _run_ope(cfg, tab.models, tr, te, fx.x_tr, fx.x_te, w_ope,
                                    decisions_at(routers, pred, fx, w_ope), log)
    laps.lap("ope")
    result = BenchmarkResult(
        models=tab.models, n_train=len(tr), n_test=len(te), cost_scale=scale, weights=weights,
        c_range=scores.c_range, curves=curves, kinds=kinds, aiq=scores.aiq, aiq_code=scores.aiq_code,
        routellm=routellm, strong_weak=strong_weak, ope_rows=ope_rows, ope_weight=w_ope, propensity=propensity,
        import_report=report, table_sha256=tab.sha256(), timings=laps.timings, config=cfg,
        router_metrics={"bc": routers.bc.metrics, "cql": routers.cql.metrics,
                        "knn": {"k": routers.knn.k, "metric": routers.knn.metric}},
        aiq_ci=scores.aiq_ci, margin_vs_random_ci=scores.margin_ci, split_info=split_info,
        aiq_by_eval=scores.aiq_by_eval, selection=selection, recommended_margins=scores.recommended_margins,
        random_router=scores.random_router, eval_intervals=scores.eval_intervals)
    log(_summary(result))
    return result, _bundle(result, routers, fx.featurizer, cfg, full)


RECOMMENDED = "recommended"


def recommended_curves(full: brec.Fitted, selection: brec.Selection, fx: Features, te: BenchmarkTable,
                       curves: dict[str, bm.Curve], cfg: BenchmarkConfig) -> dict[str, bm.Curve]:
    """The eval_name routers' test curves and the recommended router's: the candidate the validation chose,
    fitted on the whole train split (the zero router's or random's own curve when one of them was chosen)."""
    q_hat, c_hat = full.predictions(fx.x_te, te.eval_name, fx.chars_te, cfg.recommend.blend_shares)
    Qt, Ct = te.quality, te.cost
    out = {}
    for name in (br.LOOKUP, br.META):
        if name in q_hat:
            out[name] = bm.sweep(name, lambda w, q=q_hat[name]: bm.decide(q, c_hat, w),
                                 br.cost_weights(q_hat[name], c_hat, cfg.sweep_points), Qt, Ct)
    chosen = selection.recommended
    src = out.get(chosen) or curves.get(chosen)
    if src is None:
        src = bm.sweep(chosen, lambda w, q=q_hat[chosen]: bm.decide(q, c_hat, w),
                       br.cost_weights(q_hat[chosen], c_hat, cfg.sweep_points), Qt, Ct)
    out[RECOMMENDED] = dataclasses.replace(src, name=RECOMMENDED)
    return out


class _Laps:
    """Seconds per phase, in the order they ran (the report's ``timings_s``)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._t0 = time.perf_counter()

    def lap(self, name: str) -> None:
        self.timings[name] = time.perf_counter() - self._t0
        self._t0 = time.perf_counter()


def split_prompts(tab: BenchmarkTable, report: ImportReport, cfg: BenchmarkConfig, log: Callable[[str], None]
                  ) -> tuple[BenchmarkTable, BenchmarkTable, BenchmarkTable, dict]:
    """Phase 1: (table, train, test, split info), by ``cfg.split``; at least 10 prompts on each side."""
    if cfg.split == "hash":
        test = split_test(tab, cfg.test_fraction, cfg.seed)
        split_info = {"split": "hash", "test_fraction": cfg.test_fraction, "seed": cfg.seed}
    else:
        tab, test, split_info = given_split(tab, report, cfg, log)
    if test.sum() < 10 or (~test).sum() < 10:
        raise ValueError(f"{report.source}: {int((~test).sum())} train and {int(test.sum())} test prompts after the "
                         f"split ({split_info}); a benchmark needs at least 10 of each")
    return tab, tab.take(np.flatnonzero(~test)), tab.take(np.flatnonzero(test)), split_info


@dataclass(frozen=True)
class Features:
    featurizer: bfeat.PromptFeaturizer  # fitted on the train prompts only
    x_tr: np.ndarray
    x_te: np.ndarray
    chars_tr: np.ndarray  # prompt lengths (the regression router's cost model reads them)
    chars_te: np.ndarray


def fit_features(tr: BenchmarkTable, te: BenchmarkTable, cfg: BenchmarkConfig, source: str) -> Features:
    """Phase 2: the featurizer fitted on the train prompts (text, or the table's embeddings)."""
    params = {"tfidf_svd": cfg.tfidf_svd.model_dump(),
              "openai_embedding": cfg.openai_embedding.model_dump()}.get(cfg.featurizer, {})
    feat = bfeat.make_featurizer(cfg.featurizer, **params)
    if bfeat.takes_embeddings(feat):
        if tr.embedding is None:
            raise BenchmarkImportError(source, f"the {feat.name} featurizer needs the table's precomputed "
                                               "embeddings, and none were imported", column="embedding",
                                       fix="set embedding to the table's embedding column (or 'emb_*' prefix), or "
                                           "use featurizer tfidf_svd")
        x_tr, x_te = feat.fit_transform(tr.embedding), feat.transform(te.embedding)
    else:
        if not any(p.strip() for p in tr.prompt):
            raise BenchmarkImportError(source, f"the {feat.name} featurizer reads prompt text and the table "
                                               "has none", column="prompt",
                                       fix="add a prompt column, or import precomputed embeddings (embedding) and "
                                           "use featurizer embedding")
        x_tr, x_te = feat.fit_transform(tr.prompt), feat.transform(te.prompt)
    chars = lambda t: np.array([len(p) for p in t.prompt], dtype=np.float64)  # noqa: E731
    return Features(feat, x_tr, x_te, chars(tr), chars(te))


RANDOM_KIND = "baseline (its expectation: the zero router's hull)"


def baseline_curves(te: BenchmarkTable, models: tuple[str, ...],
                    random: br.RandomRouterConfig) -> tuple[dict, dict[str, str]]:
    """Phase 3: the test prompts' single models, zero router, random router (its exact expectation) and
    oracle (no learning)."""
    Qt, Ct = te.quality, te.cost
    curves = {c.name: c for c in br.single_model_curves(Qt, Ct, models)}
    kinds = {n: "single model" for n in curves}
    curves["zero_router"] = br.zero_router_curve(Qt, Ct)
    curves["random"] = br.random_router_curve(Qt, Ct, random)
    curves["oracle"] = br.oracle_curve(Qt, Ct)
    kinds |= {"zero_router": "baseline", "random": RANDOM_KIND, "oracle": "baseline (knows the outcomes)"}
    return curves, kinds


@dataclass(frozen=True)
class Routers:
    regression: br.RegressionRouter
    predictive: br.PredictiveRouter
    knn: br.KNNRouter
    bc: br.GridRouter
    cql: br.GridRouter


def train_routers(tr: BenchmarkTable, fx: Features, weights: np.ndarray, models: tuple[str, ...],
                  cfg: BenchmarkConfig, log: Callable[[str], None], lap: Callable[[str], None]) -> Routers:
    """Phase 4: every learned router on the train split (CQL on bandit feedback simulated from it);
    ``lap(name)`` after each."""
    reg = br.fit_regression(fx.x_tr, tr.quality, tr.cost, fx.chars_tr, models, cfg.regression)
    lap("regression")
    pred = br.fit_predictive(fx.x_tr, tr.quality, models, cfg.predictive)
    lap("predictive")
    knn = br.fit_knn(fx.x_tr, tr.quality, models, cfg.knn)
    lap("knn")
    bc = bt.train_bc_grid(fx.x_tr, tr.quality, tr.cost, weights, models, cfg.bc, log=log)
    lap("bc")
    train_log = bb.simulate_logs(tr.quality, tr.cost, models, cfg.train_behaviour, seed=cfg.seed + 1)
    cql = bt.train_cql_grid_bandit(fx.x_tr, train_log.action, train_log.quality, train_log.cost, weights, models,
                                   cfg.cql, log=log)
    cql.metrics["behaviour"] = train_log.behaviour
    lap("cql")
    return Routers(reg, pred, knn, bc, cql)


@dataclass(frozen=True)
class Predictions:
    """What the prediction-based routers predict for the test prompts."""

    quality: dict[str, np.ndarray]  # regression, predictive, knn: (n_test, K)
    cost: np.ndarray  # the regression router's predicted cost, which all three use
    mean_quality: np.ndarray  # the train split's mean quality per model (the cost_only baseline's)


def predict_test(routers: Routers, tr: BenchmarkTable, fx: Features) -> Predictions:
    q = {"regression": routers.regression.quality(fx.x_te), "predictive": routers.predictive.quality(fx.x_te),
         "knn": routers.knn.quality(fx.x_te)}
    return Predictions(q, routers.regression.cost(fx.x_te, fx.chars_te),
                       np.broadcast_to(tr.quality.mean(axis=0), q["regression"].shape))


def learned_curves(routers: Routers, pred: Predictions, fx: Features, te: BenchmarkTable, weights: np.ndarray,
                   sweep_points: int) -> dict[str, bm.Curve]:
    """Phase 5: cost_only and every learned router swept over cost weights on the test prompts."""
    Qt, Ct, c_hat = te.quality, te.cost, pred.cost
    curves = {"cost_only": bm.sweep("cost_only", lambda w: bm.decide(pred.mean_quality, c_hat, w),
                                    br.cost_weights(pred.mean_quality, c_hat, sweep_points), Qt, Ct)}
    for name, q_hat in pred.quality.items():
        curves[name] = bm.sweep(name, lambda w, q_hat=q_hat: bm.decide(q_hat, c_hat, w),
                                br.cost_weights(q_hat, c_hat, sweep_points), Qt, Ct)
    curves["bc"] = bm.sweep("bc", lambda w: routers.bc.decide(fx.x_te, w), weights, Qt, Ct)
    curves["cql"] = bm.sweep("cql", lambda w: routers.cql.decide(fx.x_te, w), weights, Qt, Ct)
    return curves


@dataclass(frozen=True)
class Scores:
    c_range: tuple[float, float]  # the cheapest and the dearest single model's mean cost
    aiq: dict[str, float]
    aiq_code: dict[str, float]
    aiq_ci: dict[str, tuple[float, float]]
    margin_ci: dict[str, tuple[float, float]]
    aiq_by_eval: dict[str, dict[str, float]]
    recommended_margins: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    random_router: dict = dataclasses.field(default_factory=dict)
    eval_intervals: EvalIntervals | None = None


def score_curves(curves: dict[str, bm.Curve], te: BenchmarkTable, cfg: BenchmarkConfig) -> Scores:
    """Phase 6: AIQ (the paper's and RouterBench's code's), bootstrap intervals and margins over random,
    the random router's draws, AIQ per eval_name with intervals from a bootstrap within each eval."""
    Qt, Ct = te.quality, te.cost
    c_min, c_max = bm.cost_range(Ct.mean(axis=0))
    aiq = {n: c.aiq(c_min, c_max) for n, c in curves.items()}
    # RouterBench's code: from each router's own first point, over x_max, the largest cost on any NDCH
    x_max = max(float(bm.ndch(c.cost, c.quality)[0][-1]) for c in curves.values())
    aiq_code = {n: bm.aiq_routerbench_code(c.cost, c.quality, x_max) for n, c in curves.items()}
    boot = bm.bootstrap_aiq({n: c for n, c in curves.items() if n != "oracle"}, Qt, Ct, cfg.aiq_boot, cfg.seed)
    aiq_ci = {n: _ci95(v) for n, v in boot.items()}
    margin_ci = {n: _ci95(v - boot["random"]) for n, v in boot.items() if n != "random"}
    rec = {b: _ci95(boot[RECOMMENDED] - boot[b]) for b in MARGIN_BASELINES if RECOMMENDED in boot and b in boot}
    own_hull = {"random": lambda q, c: br.random_router_curve(q, c, cfg.random)}  # random mixes each eval's hull
    by_eval = bm.aiq_by_group(curves, Qt, Ct, te.eval_name, recompute=own_hull)
    eval_boot = bm.bootstrap_aiq_by_group({n: curves[n] for n in EVAL_HEADS if n in curves and n != "oracle"},
                                          Qt, Ct, te.eval_name, cfg.aiq_boot, cfg.seed, recompute=own_hull)
    prompts = {e: int((te.eval_name == e).sum()) for e in eval_boot}
    return Scores((c_min, c_max), aiq, aiq_code, aiq_ci, margin_ci, by_eval, rec,
                  random_summary(Qt, Ct, cfg, aiq["random"]), EvalIntervals.from_boot(eval_boot, prompts))


def random_summary(quality: np.ndarray, cost: np.ndarray, cfg: BenchmarkConfig, exact: float) -> dict:
    """The random router's AIQ as reported (its exact expectation) beside ``cfg.random.draws`` independent draws:
    each scored on its own path (mean, sd, standard error of the mean: an unbiased check of the expectation),
    and the hull of each draw's points (what rounds 1-3 reported: biased upwards by the noise it picks)."""
    c_min, c_max = bm.cost_range(cost.mean(axis=0))
    dc, dq = br.random_router_draws(quality, cost, cfg.random, cfg.seed)
    path, hull = bm.path_aiq(dc, dq, c_min, c_max), bm.aiq_batch(dc, dq, c_min, c_max)
    return {"aiq": exact, "method": "exact expectation: each point mixes two adjacent vertices of the zero router's "
                                    "hull, so its expected curve is that hull and its AIQ the zero router's",
            "draws": len(path), "draws_mean": float(path.mean()), "draws_sd": float(path.std(ddof=1)),
            "draws_se": float(path.std(ddof=1) / np.sqrt(len(path))),
            "hull_of_one_draw_mean": float(hull.mean()), "hull_of_one_draw_sd": float(hull.std(ddof=1))}


def routellm_scores(routers: Routers, pred: Predictions, fx: Features, models: tuple[str, ...],
                    tr: BenchmarkTable, te: BenchmarkTable, log: Callable[[str], None]
                    ) -> tuple[dict[str, bm.RouteLLMMetrics], tuple[str, str] | None]:
    """Phase 7, two-model tables only: RouteLLM's APGR and CPT from each router's strong-minus-weak score
    (strong: the better model on the train prompts; undefined when it is not better on the test ones); the
    random router's from its expected curve (APGR 0.5), the oracle's from RouteLLM's optimal one."""
    if len(models) != 2:
        return {}, None
    s = int(np.argmax(tr.quality.mean(axis=0)))
    wk = 1 - s
    Qt = te.quality
    if not Qt[:, s].mean() > Qt[:, wk].mean():
        log("routing benchmark: the strong model does not beat the weak one on the test prompts; "
            "APGR and CPT are not defined")
        return {}, (models[s], models[wk])
    scores = {"oracle": None,  # RouteLLM's optimal curve
              **{n: q[:, s] - q[:, wk] for n, q in pred.quality.items()},
              "bc": _diff(routers.bc.outputs(fx.x_te, 0), s, wk), "cql": _diff(routers.cql.outputs(fx.x_te, 0), s, wk)}
    random = bm.routellm_metrics_of(*bm.routellm_random_curve(Qt[:, s], Qt[:, wk]), Qt[:, s], Qt[:, wk])
    return ({"random": random} | {n: bm.routellm_metrics(v, Qt[:, s], Qt[:, wk]) for n, v in scores.items()},
            (models[s], models[wk]))


def decisions_at(routers: Routers, pred: Predictions, fx: Features, w: float) -> dict[str, np.ndarray]:
    """Every learned router's (and cost_only's) model per test prompt at cost weight ``w`` (what OPE evaluates)."""
    return {**{n: bm.decide(q, pred.cost, w) for n, q in pred.quality.items()},
            "cost_only": bm.decide(pred.mean_quality, pred.cost, w),
            "bc": routers.bc.decide(fx.x_te, w), "cql": routers.cql.decide(fx.x_te, w)}


def _bundle(result: BenchmarkResult, routers: Routers, feat: bfeat.PromptFeaturizer,
            cfg: BenchmarkConfig, full: brec.Fitted) -> br.RouterBundle:
    """The routers as saved for serving, with their manifest."""
    zc = result.curves["zero_router"]
    hull = [result.models[k] for k in br.hull_vertices(zc.quality[None, :], zc.cost[None, :])]
    return br.RouterBundle(feat, result.models, routers.regression, {"bc": routers.bc, "cql": routers.cql},
                           predictors={"predictive": routers.predictive, "knn": routers.knn}, lookup=full.lookup,
                           meta=full.meta, recommended=brec.serving_spec(result.recommended,
                                                                         cfg.recommend.blend_shares), manifest={
        "zero_router_hull": hull,
        "kind": "routing_benchmark", "featurizer": feat.name, "training_data_sha256": result.table_sha256,
        "source": result.import_report.source, "test_fraction": cfg.test_fraction, "split_seed": cfg.seed,
        "split": {k: v for k, v in result.split_info.items() if k != "test_import"},
        "cost_scale_usd": result.cost_scale, "cost_weights": result.weights.tolist(),
        "aiq": {n: result.aiq[n] for n in (*LEARNED, *OFFLINE_RL, br.LOOKUP, RECOMMENDED, "zero_router", "oracle")
                if n in result.aiq},
        "note": "route(prompts, cost_weight): cost_weight in quality units per USD; the grid routers use the "
                "member trained for the nearest weight"})


def _summary(result: BenchmarkResult) -> str:
    aiq, rec, m = result.aiq, result.recommended, result.recommended_margins
    names = (*LEARNED, *OFFLINE_RL, br.LOOKUP, "cost_only", "oracle")
    return ("routing benchmark: AIQ " + ", ".join(f"{n} {aiq[n]:.4f}" for n in names if n in aiq)
            + f" vs zero router {aiq['zero_router']:.4f}, random {aiq['random']:.4f}; recommended (on validation "
            + f"prompts) {rec}: test AIQ {aiq[RECOMMENDED]:.4f}, paired margin over random "
            + f"{_fmt_ci(m.get('random'))}, zero router {_fmt_ci(m.get('zero_router'))}, eval_name lookup "
            + f"{_fmt_ci(m.get(br.LOOKUP))}: it {result.verdict_vs_random}")


def _diff(out: np.ndarray, s: int, w: int) -> np.ndarray:
    return out[:, s] - out[:, w]


def _lazy(fn: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """``fn()`` computed on the first call only (the reward model: fitted only if a policy is supported)."""
    cache: list[np.ndarray] = []

    def get() -> np.ndarray:
        if not cache:
            cache.append(fn())
        return cache[0]
    return get


def _one_hot(choice: np.ndarray, K: int) -> np.ndarray:
    return np.eye(K)[choice]


def _run_ope(cfg: BenchmarkConfig, models: tuple[str, ...], tr: BenchmarkTable, te: BenchmarkTable,
             x_tr: np.ndarray, x_te: np.ndarray, w: float, decisions: dict[str, np.ndarray],
             log: Callable[[str], None]) -> tuple[list[dict], dict]:
    K = len(models)
    mean_cost = tr.cost.mean(axis=0)
    pis = {n: _one_hot(d, K) for n, d in decisions.items()}
    basis = bb.reward_basis(x_te, np.array([len(p) for p in te.prompt]), cfg.ope.basis_dim)
    truth = {n: bb.true_value(pi, te.quality, te.cost, w) for n, pi in pis.items()}
    rows, propensity = [], {}
    for j, spec in enumerate(cfg.ope_behaviours):
        log_te = bb.simulate_logs(te.quality, te.cost, models, spec, seed=cfg.seed + 100 + j, mean_cost=mean_cost)
        q_hat = _lazy(lambda lg=log_te: bb.reward_model(basis, lg.action, lg.reward(w), K, cfg.ope))

        evals = [bb.evaluate(log_te, pi, q_hat, w, n, models, cfg.ope) | {"propensities": "logged"}
                 for n, pi in pis.items()]
        if len(np.unique(log_te.action)) > 1:  # BC can only estimate propensities of logs with a choice in them
            log_tr = bb.simulate_logs(tr.quality, tr.cost, models, spec, seed=cfg.seed + 200 + j, mean_cost=mean_cost)
            predict, metrics = bb.fit_propensities(x_tr, log_tr.action, K, cfg.propensity_bc, log=log)
            p_hat = bb.floored(predict(x_te)[np.arange(len(log_te)), log_te.action])
            metrics["mae_vs_true"] = float(np.abs(p_hat - log_te.pscore).mean())
            propensity[log_te.behaviour] = metrics
            evals += [bb.evaluate(log_te, pi, q_hat, w, n, models, cfg.ope, pscore=p_hat)
                      | {"propensities": "estimated by BC"} for n, pi in pis.items()]
        rows += bb.summarise(evals, truth)
        log(f"routing benchmark OPE under {log_te.behaviour}: "
            + ", ".join(f"{e['policy']} DR {e['estimates']['dr']['value']:.4f} (truth {truth[e['policy']]:.4f})"
                        if e["estimates"] else f"{e['policy']} no support" for e in evals[:len(pis)]))
    return rows, propensity


# ----------------------------------------------------------------------------- outputs
def plot_benchmark(result: BenchmarkResult) -> bytes:
    """Cost-quality plane (and, for two models, RouteLLM's quality vs strong-call share)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    two = bool(result.routellm)
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(13 if two else 7.5, 5))
    ax = axes[0] if two else axes
    colors = {"zero_router": "0.4", "random": "0.7", "oracle": "tab:green", "cost_only": "tab:brown",
              "regression": "tab:blue", "predictive": "tab:cyan", "knn": "tab:olive", "bc": "tab:orange",
              "cql": "tab:purple", br.LOOKUP: "tab:pink", br.META: "tab:red", RECOMMENDED: "k"}
    for name, c in result.curves.items():
        if result.kinds[name] == "single model":
            ax.scatter(c.cost, c.quality, s=70, marker="s", zorder=5, color="k")
            ax.annotate(name.split("/")[-1], (c.cost[0], c.quality[0]), textcoords="offset points", xytext=(5, -12),
                        fontsize=8)
            continue
        hc, hq = bm.ndch(c.cost, c.quality)
        hc, hq = np.append(hc, result.c_range[1]), np.append(hq, hq[-1])
        style = "--" if name in ("zero_router", "oracle") else "-"
        label = f"{name} (AIQ {result.aiq[name]:.4f})"
        if name != "zero_router":
            ax.scatter(c.cost, c.quality, s=10, color=colors.get(name), alpha=0.6)
        ax.plot(hc, hq, style, color=colors.get(name), label=label)
    ax.set_xlabel("mean cost per prompt (USD)")  # linear: AIQ integrates over linear cost
    ax.set_ylabel("mean quality")
    ax.set_title(f"Held-out prompts (n={result.n_test:,}): cost-quality curves and their NDCH")
    ax.legend(fontsize=8, loc="lower right")
    if two:
        ax2 = axes[1]
        s = result.strong_weak[0]
        for name, m in result.routellm.items():
            ax2.plot(100 * m.strong_share, m.quality, marker=".", color=colors.get(name),
                     label=f"{name} (APGR {m.apgr:.3f})")
        ax2.set_xlabel(f"calls to the strong model {s.split('/')[-1]} (%)")
        ax2.set_ylabel("mean quality")
        ax2.set_title("RouteLLM's curve (thresholds at score deciles)")
        ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return artifacts.png_bytes(fig)


def write_outputs(result: BenchmarkResult, bundle: br.RouterBundle, reports_dir: Path, checkpoint_dir: Path,
                  public: Callable[[Path], Path] = lambda p: p) -> tuple[dict[str, Path], bytes]:
    """The JSON report and PNG under ``reports_dir``, the routers under ``checkpoint_dir``; returns the
    paths (``public``: where they will be read, for a staged set: artifacts.SetStage.public) and the PNG.
    Each file is atomic; the asset writes the three as one ``atomic_set``, so they switch together."""
    png = plot_benchmark(result)
    paths = {"report": reports_dir / REPORT_NAME, "plot": reports_dir / PLOT_NAME, "checkpoint": checkpoint_dir}
    shown = {k: public(v) for k, v in paths.items()}
    br.save_bundle(checkpoint_dir, bundle)
    artifacts.write_bytes(paths["plot"], png)
    artifacts.write_json(paths["report"], result.to_dict() | {"artifacts": {k: str(v) for k, v in shown.items()}})
    return shown, png


def metadata_markdown(result: BenchmarkResult, max_dropped: int = 20) -> dict[str, str]:
    """Markdown blocks for the asset's metadata: results, OPE, costs, what was dropped, RouteLLM context."""
    rep = result.import_report
    z, rec, m, sel = result.aiq["zero_router"], result.recommended, result.recommended_margins, result.selection
    chosen = (f"the validation prompts' best candidate, {sel.best_candidate}, did not beat the zero router within "
              f"its interval ({_fmt_ci(sel.margin_vs_zero_ci.get(sel.best_candidate))}), so the recommendation is "
              "the zero router's hull" if sel and sel.fallback else
              f"**{rec}** had the best AIQ of {len(sel.validation_aiq) if sel else 0} candidates on "
              f"{sel.n_validation if sel else 0:,} validation prompts (a part of the train split; fitted on the "
              "rest), refitted on the whole train split")
    verdict = (f"**Recommended router**: {chosen}. On the held-out test prompts (never used to choose) it has AIQ "
               f"{result.aiq[RECOMMENDED]:.4f}; paired 95% intervals of its margin over the zero router "
               f"{_fmt_ci(m.get('zero_router'))}, the random router {_fmt_ci(m.get('random'))} and the eval_name "
               f"lookup {_fmt_ci(m.get(br.LOOKUP))}: it {result.verdict_vs_random} (zero router {z:.4f}, random "
               f"{result.aiq['random']:.4f}, oracle {result.aiq['oracle']:.4f}). {_random_note(result)} "
               f"`{br.LOOKUP}` routes by each model's mean train quality per "
               f"eval_name; `{br.META}` is the regression on the prompt features plus eval_name. BC and CQL are "
               f"shown for the OPE part only: {OFFLINE_RL_NOTE} "
               "`AIQ mean over eval_name`: RouterBench's average of the AIQ "
               f"per dataset ({len(result.aiq_by_eval)} eval_name(s) with at least 10 test prompts). "
               "`cost_only` routes by predicted price with each model's mean "
               "quality: the learned routers' margin over it is what predicting quality adds. "
               f"AIQ: the NDCH's mean quality over [{result.c_range[0]:.3g}, {result.c_range[1]:.3g}] USD per "
               "prompt, from the cheapest to the dearest single model (RouterBench's paper); `AIQ (RouterBench "
               "code)`: its calc_AIQ, area from the router's first point divided by the largest cost; "
               f"{result.n_train:,} train / {result.n_test:,} held-out test prompts.")
    means = {n: result.aiq_eval_mean(n) for n in EVAL_HEADS}
    if any(v is not None for v in means.values()):
        verdict += " " + _eval_headline(result, means)
    out = {"results": verdict + "\n\n" + markdown.table(result.results_rows(), digits=4)}
    if result.selection:
        out["selection"] = ("How the recommended router was chosen: every candidate fitted on "
                            f"{result.selection.n_fit:,} train prompts and scored on the other "
                            f"{result.selection.n_validation:,} (validation AIQ; margin over the zero router with a "
                            "Bonferroni-adjusted interval). The test prompts played no part.\n\n"
                            + markdown.table(result.selection.table(), digits=4))
    if result.aiq_by_eval:
        out["per_eval"] = ("AIQ per eval_name with its 95% interval (each on that eval's own cost range and hull, "
                           "the interval from a bootstrap of that eval's test prompts; random is its expectation on "
                           "that eval's hull, the zero router's) and the recommended router's paired margins\n\n"
                           + markdown.table(per_eval_rows(result), digits=4))
    if result.routellm:
        pub = bm.ROUTELLM_MMLU_PUBLISHED
        out["routellm"] = (
            f"APGR and CPT as RouteLLM defines them (strong {result.strong_weak[0]}, weak "
            f"{result.strong_weak[1]}); CPT is the share of strong calls.\n\n"
            + markdown.table([{"router": n, "APGR": m.apgr, "CPT(50%)": m.cpt50, "CPT(80%)": m.cpt80}
                              for n, m in result.routellm.items()], digits=3)
            + f"\n\nRouteLLM's published MMLU range ({pub['source']}): random APGR 0.50 (CPT(50%) 50%, "
              f"CPT(80%) 80%); routers trained on Arena preferences only about random; the best with MMLU "
              f"labels APGR about 0.60, CPT(50%) about 35%, CPT(80%) about 70%. Their routers were trained "
              "elsewhere and tested on all of MMLU; ours train on 75% of these prompts: context, not a "
              "head-to-head result.")
    out["ope"] = (f"Logged bandit feedback simulated on the test prompts; every rl.ope estimator (95% bootstrap "
                  f"intervals) for each router at cost weight {result.ope_weight:.4g} per USD (reward = quality - "
                  "w * cost), next to the exact value from the full table.\n\n"
                  + markdown.table(result.ope_table(), digits=4))
    out["costs"] = (f"Where each cost came from (cells per model); {COST_NOTE}\n\n" + markdown.table(rep.cost_table()))
    dropped = [{"file": Path(d.file).name, "row": d.row, "column": d.column, "reason": d.reason, "value": d.value}
               for d in rep.dropped[:max_dropped]]
    out["dropped"] = (f"{rep.rows_read:,} rows read, {rep.rows_kept:,} prompts kept, {rep.n_dropped:,} rows dropped, "
                      f"{rep.excluded:,} excluded ({rep.exclude_file or 'no exclusion list'}), "
                      f"{len(rep.dropped_files)} file(s) dropped, {len(rep.dropped_index_columns)} pandas index "
                      f"column(s) dropped; qualities checked on {rep.quality_scale}.\n\n"
                      + markdown.table(rep.dropped_table())
                      + ("\n\nIndex columns dropped:\n\n" + "\n".join(f"- {c}" for c in rep.dropped_index_columns[:20])
                         if rep.dropped_index_columns else "")
                      + ("\n\nFirst dropped rows:\n\n" + markdown.table(dropped) if dropped else ""))
    return out


def _random_note(result: BenchmarkResult) -> str:
    r = result.random_router
    if not r:
        return ""
    return (f"`random` is its exact expectation (each point mixes two adjacent vertices of the zero router's hull, "
            f"so its AIQ is the zero router's); {r['draws']} independent draws on these prompts, each scored on its "
            f"own path, average {r['draws_mean']:.4f} (± {r['draws_se']:.4f}; one draw's sd {r['draws_sd']:.4f}), "
            "while the hull of one draw's points, what rounds 1-3 reported, averages "
            f"{r['hull_of_one_draw_mean']:.4f}.")


def _ci_cell(value: float | None, ci: tuple[float, float] | None, sign: str = "") -> str | None:
    if value is None:
        return None
    return f"{value:{sign}.4f}" + (f" [{ci[0]:{sign}.4f}, {ci[1]:{sign}.4f}]" if ci else "")


def _named(evals: list[str]) -> str:
    shown = ", ".join(evals[:NAMED_EVALS])
    return shown + (f" and {len(evals) - NAMED_EVALS} more" if len(evals) > NAMED_EVALS else "")


def _eval_headline(result: BenchmarkResult, means: dict[str, float | None]) -> str:
    """RouterBench's per-eval headline with its intervals, naming the evals whose intervals cannot separate the
    recommended router from each baseline."""
    iv = result.eval_intervals
    text = ("**Per-eval_name headline** (RouterBench's: the mean of each eval's AIQ, each on its own eval's hull; "
            "95% intervals from a bootstrap within each eval): "
            + ", ".join(f"{n} {_ci_cell(v, iv.mean.get(n) if iv else None)}" for n, v in means.items() if v is not None)
            + "; pooled: " + ", ".join(f"{n} {result.aiq[n]:.4f}" for n in means if n in result.aiq) + ".")
    if not iv or not iv.margins:
        return text
    n_evals = len(iv.margins)
    parts = []
    for base in ("zero_router", br.LOOKUP):
        if base not in iv.mean_margins:
            continue
        lost = iv.not_separated(base)
        mm = iv.mean_margins[base]
        parts.append(f"over {base} the headline margin is {_fmt_ci(mm)}, and in {len(lost)} of {n_evals} evals the "
                     "paired interval includes 0" + (f" ({_named(lost)})" if lost else ""))
    return text + (" The recommended router per eval: " + "; ".join(parts)
                   + ": there the eval's prompts cannot separate the two." if parts else "")


def per_eval_rows(result: BenchmarkResult) -> list[dict]:
    """The per_eval table: each eval's AIQ per head router with its interval, the recommended router's paired
    margins, and last RouterBench's headline (the mean over evals) with its interval."""
    iv = result.eval_intervals
    rows = []
    for e, v in result.aiq_by_eval.items():
        ci = iv.aiq.get(e, {}) if iv else {}
        mg = iv.margins.get(e, {}) if iv else {}
        rows.append({"eval_name": e, "test prompts": iv.prompts.get(e) if iv else None,
                     **{n: _ci_cell(v.get(n), ci.get(n)) for n in EVAL_HEADS},
                     **{f"recommended - {b}": _ci_cell(v[RECOMMENDED] - v[b], mg.get(b), "+")
                        for b in ("zero_router", br.LOOKUP) if RECOMMENDED in v and b in v}})
    means = {n: result.aiq_eval_mean(n) for n in EVAL_HEADS}
    rows.append({"eval_name": "mean (RouterBench's headline)", "test prompts": sum(iv.prompts.values()) if iv else None,
                 **{n: _ci_cell(means[n], iv.mean.get(n) if iv else None) for n in EVAL_HEADS},
                 **{f"recommended - {b}": _ci_cell(means[RECOMMENDED] - means[b],
                                                   iv.mean_margins.get(b) if iv else None, "+")
                    for b in ("zero_router", br.LOOKUP) if means.get(RECOMMENDED) is not None
                    and means.get(b) is not None}})
    return rows


COST_NOTE = ("`table`: the table's own cost column; `price_table_tokens`: prompt + response tokens (characters / "
             "chars_per_token) times the price table's per-token prices; `price_table_default_output`: prompt tokens "
             "+ the price table's default output tokens (the table has no responses); `default_cost_per_call`: the "
             "configured flat default.")
