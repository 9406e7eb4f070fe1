"""The benchmark end to end on small tables: split, routers, metrics, OPE, report, saved routers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.routing import benchmark_routers as br
from sage_pipeline.routing import benchmark_run as brun
from sage_pipeline.routing import benchmark_train as bt
from sage_pipeline.routing.benchmark_import import BenchmarkImportError, ImportConfig, import_benchmark
from sage_pipeline_tests.routing.test_benchmark_routers import synthetic_table

SLICE = Path(__file__).parent / "fixtures" / "routellm_mmlu_slice"


def _fast(**kw) -> brun.BenchmarkConfig:
    return brun.BenchmarkConfig(featurizer_params={"n_components": 16}, bc=bt.BCGridConfig(steps=100),
                                cql=CQLConfig(mode="bandit", hidden=(8,), steps=100, alpha=0.03),
                                ope=brun.bb.BanditOPEConfig(n_boot=20), **kw)


def test_split_is_by_prompt_text_stable_and_seeded():
    tab, _ = import_benchmark(ImportConfig(path=SLICE), log=lambda s: None)
    a, b = brun.split_test(tab, 0.25, 0), brun.split_test(tab, 0.25, 0)
    assert np.array_equal(a, b) and 0.15 < a.mean() < 0.35
    assert not np.array_equal(a, brun.split_test(tab, 0.25, 1))
    doubled = tab.take(np.concatenate([np.arange(len(tab)), np.arange(len(tab))]))
    d = brun.split_test(doubled, 0.25, 0)
    assert np.array_equal(d[: len(tab)], d[len(tab):])  # the same text always lands on the same side


@pytest.fixture(scope="module")
def mmlu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result, bundle = brun.run_benchmark(_fast(table=ImportConfig(path=SLICE)), log=lambda s: None)
    paths, png = brun.write_outputs(result, bundle, out / "reports", out / "ck")
    return result, bundle, paths, png


def test_two_model_run_has_every_baseline_router_and_metric(mmlu_run):
    result, _, _, _ = mmlu_run
    assert result.n_train + result.n_test == 359
    assert set(result.curves) == {*result.models, "zero_router", "random", "oracle", "cost_only", "regression",
                                  "bc", "cql"}
    aiq = result.aiq
    assert aiq["oracle"] >= max(aiq[n] for n in ("zero_router", "regression", "bc", "cql", "cost_only"))
    assert aiq["gpt-4-1106-preview"] == 0.0  # a single point at the top of the cost range
    assert set(result.routellm) == {"random", "oracle", "regression", "bc", "cql"}
    assert result.strong_weak == ("gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert result.routellm["oracle"].apgr > result.routellm["random"].apgr
    rows = {r["router"]: r for r in result.results_rows()}
    assert rows["zero_router"]["AIQ - zero router"] == 0.0 and rows["regression"]["APGR"] is not None
    assert result.beats_zero_router == (aiq[result.best_learned] > aiq["zero_router"])


def test_ope_rows_compare_every_estimate_with_the_truth(mmlu_run):
    result, _, _, _ = mmlu_run
    by = {(r["behaviour"], r["policy"], r["propensities"], r["estimator"]): r for r in result.ope_rows}
    static = [r for k, r in by.items() if k[0].startswith("static")]
    assert static and all(r["note"] == "no support" for r in static)
    dr = by[("uniform", "regression", "logged", "dr")]
    assert dr["low"] <= dr["estimate"] <= dr["high"] and dr["error"] == pytest.approx(dr["estimate"] - dr["truth"])
    assert ("uniform", "regression", "estimated by BC", "dr") in by
    assert set(result.propensity) == {"uniform", "epsilon(gpt-4-1106-preview, 0.3)"}
    assert result.propensity["uniform"]["mae_vs_true"] < 0.05
    table = result.ope_table()
    assert {"behaviour", "policy", "truth"} <= set(table[0])


def test_outputs_report_plot_and_routers(mmlu_run):
    result, bundle, paths, png = mmlu_run
    report = json.loads(paths["report"].read_text())
    assert report["models"] == list(result.models) and report["best_learned"] == result.best_learned
    assert report["import"]["excluded"] == 1 and report["routellm"]["published_mmlu"]["best_with_mmlu_labels"]
    assert len(report["curves"]["regression"]["cost"]) == br.DEFAULT_SWEEP_POINTS
    assert png[:4] == b"\x89PNG" and paths["plot"].read_bytes() == png
    loaded = br.load_bundle(paths["checkpoint"])
    assert loaded.manifest["training_data_sha256"] == result.table_sha256
    prompts = ["Which of these is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9\nAnswer:"] * 2
    assert loaded.route(prompts, 0.0, "bc") == bundle.route(prompts, 0.0, "bc")
    md = brun.metadata_markdown(result)
    assert set(md) == {"results", "routellm", "ope", "costs", "dropped"} and "RouteLLM's published" in md["routellm"]


def test_many_models_in_routerbench_layout(tmp_path):
    """Three models: AIQ against the zero router's hull; no APGR (it is defined for two models)."""
    base = synthetic_table(600, seed=2)
    df = pd.DataFrame({"sample_id": base.prompt_id, "prompt": base.prompt, "eval_name": base.eval_name})
    mid_q = np.maximum(base.quality[:, 0], base.quality[:, 1] * (np.arange(600) % 2))
    for name, q, c in (("cheap", base.quality[:, 0], base.cost[:, 0]), ("mid", mid_q, 3 * base.cost[:, 0]),
                       ("strong", base.quality[:, 1], base.cost[:, 1])):
        df[name], df[f"{name}|total_cost"], df[f"{name}|model_response"] = q, c, "A"
    df.to_parquet(tmp_path / "rb.parquet")
    result, _ = brun.run_benchmark(_fast(table=ImportConfig(path=tmp_path / "rb.parquet")), log=lambda s: None)
    assert result.models == ("cheap", "mid", "strong") and result.routellm == {}
    assert result.aiq["regression"] > result.aiq["zero_router"]
    assert result.curves["oracle"].share.shape[1] == 3


def test_config_and_table_errors():
    with pytest.raises(ValueError, match="test_fraction"):
        brun.BenchmarkConfig(test_fraction=1.0)
    tab = synthetic_table(30)
    one = brun.BenchmarkTable(tab.prompt_id, tab.prompt, tab.eval_name, ("cheap",), tab.quality[:, :1],
                              tab.cost[:, :1], tab.cost_source[:, :1], tab.file, tab.row, tab.files)
    with pytest.raises(ValueError, match="at least 2 models"):
        brun.run_benchmark(_fast(), table=(one, brun.ImportReport(source="t")))
    with pytest.raises(ValueError, match="at least 10 of each"):
        brun.run_benchmark(_fast(test_fraction=0.01), table=(tab, brun.ImportReport(source="t")))


def test_every_router_has_a_bootstrap_interval_and_the_verdict_is_against_random(mmlu_run):
    result, _, paths, _ = mmlu_run
    for name in (*result.learned, "random", "zero_router", "cost_only"):
        lo, hi = result.aiq_ci[name]
        assert lo <= result.aiq[name] + 1e-9 and result.aiq[name] <= hi + 1e-9, name
    assert "random" not in result.margin_vs_random_ci and set(result.learned) <= set(result.margin_vs_random_ci)
    best = result.best_learned
    assert result.beats_random_router == (result.aiq_ci[best][0] > result.aiq["random"]
                                          and result.margin_vs_random_ci[best][0] > 0)
    report = json.loads(paths["report"].read_text())
    assert report["beats_random_router"] == result.beats_random_router and best in report["aiq_ci95"]


def _routellm_frame(prompts, rng) -> pd.DataFrame:
    weak, strong = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
    return pd.DataFrame({"prompt": prompts, weak: rng.random(len(prompts)) < 0.6,
                         strong: rng.random(len(prompts)) < 0.8})


def test_given_split_from_train_and_test_files(tmp_path):
    rng = np.random.default_rng(0)
    train = [f"train question {i} about topic {i % 7}" for i in range(120)]
    test = [f"test question {i} about topic {i % 7}" for i in range(40)] + [train[0]]  # one leaked prompt
    (tmp_path / "tr").mkdir()
    (tmp_path / "te").mkdir()
    _routellm_frame(train, rng).to_csv(tmp_path / "tr" / "mmlu_train.csv")  # with pandas' index, as shipped
    _routellm_frame(test, rng).to_csv(tmp_path / "te" / "mmlu_test.csv")
    cfg = _fast(table=ImportConfig(path=tmp_path / "tr"), split="given", test_table=ImportConfig(path=tmp_path / "te"))
    result, bundle = brun.run_benchmark(cfg, log=lambda s: None)
    assert (result.n_train, result.n_test) == (120, 40)
    assert result.split_info["test_prompts_also_in_train_dropped"] == 1
    assert result.split_info["test_import"]["dropped_index_columns"]
    assert bundle.manifest["split"]["split"] == "given"
    assert set(result.aiq_by_eval) == {"mmlu"}  # the split suffix is not part of the eval_name
    with pytest.raises(ValueError, match="only read with split='given'"):
        _fast(table=ImportConfig(path=tmp_path / "tr"), test_table=ImportConfig(path=tmp_path / "te"))


def test_given_split_from_a_split_column_and_its_errors(tmp_path):
    tab = synthetic_table(400)
    df = pd.DataFrame({"sample_id": tab.prompt_id, "prompt": tab.prompt, "eval_name": np.where(
        np.arange(400) % 2 == 0, "algebra_set", "history_set"), "split": np.where(np.arange(400) < 300, "train", "Test")})
    for k, m in enumerate(tab.models):
        df[m] = tab.quality[:, k]
        df[f"{m}|total_cost"] = tab.cost[:, k]
    df.to_csv(tmp_path / "rb.csv", index=False)
    result, _ = brun.run_benchmark(_fast(table=ImportConfig(path=tmp_path / "rb.csv"), split="given"),
                                   log=lambda s: None)
    assert (result.n_train, result.n_test) == (300, 100)
    # per-eval_name AIQ next to the pooled one, and their mean
    assert set(result.aiq_by_eval) == {"algebra_set", "history_set"}
    mean = np.mean([result.aiq_by_eval[e]["regression"] for e in ("algebra_set", "history_set")])
    row = {r["router"]: r for r in result.results_rows()}["regression"]
    assert row["AIQ mean over eval_name"] == pytest.approx(mean)
    df.loc[310, "split"] = "validation"
    df.to_csv(tmp_path / "rb.csv", index=False)
    with pytest.raises(BenchmarkImportError, match=r"rb\.csv: row 311: column 'split': split 'validation' is neither"):
        brun.run_benchmark(_fast(table=ImportConfig(path=tmp_path / "rb.csv"), split="given"), log=lambda s: None)
    df.drop(columns="split").to_csv(tmp_path / "rb.csv", index=False)
    with pytest.raises(BenchmarkImportError, match="split: given needs a test table"):
        brun.run_benchmark(_fast(table=ImportConfig(path=tmp_path / "rb.csv"), split="given"), log=lambda s: None)
