"""The benchmark end to end on small tables: split, routers, metrics, OPE, report, saved routers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.routing_benchmark import (
    metrics as bm,
    prompt_features as bfeat,
    routers as br,
    run as brun,
    train as bt,
)
from sage_pipeline.routing_benchmark.importer import BenchmarkImportError, ImportConfig, import_benchmark
from sage_pipeline_tests.routing_benchmark.test_routers import synthetic_table

SLICE = Path(__file__).parent / "fixtures" / "routellm_mmlu_slice"


def _fast(**kw) -> brun.BenchmarkConfig:
    return brun.BenchmarkConfig(**{"tfidf_svd": bfeat.TfidfSvdConfig(n_components=16), "bc": bt.BCGridConfig(steps=100),
                                   "cql": CQLConfig(mode="bandit", hidden=(8,), steps=100, alpha=0.03),
                                   "ope": brun.bb.BanditOPEConfig(n_boot=20), "aiq_boot": 50} | kw)


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
                                  "predictive", "knn", "bc", "cql", "eval_lookup", "regression_meta", "recommended"}
    aiq = result.aiq
    assert aiq["oracle"] >= max(aiq[n] for n in ("zero_router", "regression", "bc", "cql", "cost_only"))
    assert aiq["gpt-4-1106-preview"] == 0.0  # a single point at the top of the cost range
    assert set(result.routellm) == {"random", "oracle", "regression", "predictive", "knn", "bc", "cql"}
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
    assert set(md) == {"results", "selection", "per_eval", "routellm", "ope", "costs", "dropped"}
    assert "RouteLLM's published" in md["routellm"]


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
    # the verdict is on the router the validation prompts chose, not on the best one on the test prompts
    assert result.beats_random_router == (result.recommended_margins["random"][0] > 0)
    assert set(result.recommended_margins) == {"zero_router", "random", "eval_lookup"}
    report = json.loads(paths["report"].read_text())
    assert report["beats_random_router"] == result.beats_random_router
    assert report["recommended"]["router"] == result.recommended
    assert report["recommended"]["selection"]["validation_aiq"] == result.selection.validation_aiq


def _routellm_frame(prompts, rng) -> pd.DataFrame:
    weak, strong = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
    return pd.DataFrame({"prompt": prompts, weak: rng.random(len(prompts)) < 0.6,
                         strong: rng.random(len(prompts)) < 0.8})


def test_given_split_from_train_and_test_files(tmp_path):
    rng = np.random.default_rng(0)
    words = "algebra history chemistry poetry law biology music geology economics physics astronomy".split()
    train = [f"question {i} about {words[i % 11]} and {words[(i * 7) % 11]} in {words[(i * 3) % 11]}"
             for i in range(120)]
    test = [f"exam item {i} on {words[i % 11]} with {words[(i * 5) % 11]}" for i in range(40)] + [train[0]]
    (tmp_path / "tr").mkdir()
    (tmp_path / "te").mkdir()
    _routellm_frame(train, rng).to_csv(tmp_path / "tr" / "mmlu_train.csv")  # with pandas' index, as shipped
    _routellm_frame(test, rng).to_csv(tmp_path / "te" / "mmlu_test.csv")
    cfg = _fast(table=ImportConfig(path=tmp_path / "tr"), split="given", test_path=tmp_path / "te")
    result, bundle = brun.run_benchmark(cfg, log=lambda s: None)
    assert (result.n_train, result.n_test) == (120, 40)
    assert result.split_info["test_prompts_also_in_train_dropped"] == 1
    assert result.split_info["test_import"]["dropped_index_columns"]
    assert bundle.manifest["split"]["split"] == "given"
    assert set(result.aiq_by_eval) == {"mmlu"}  # the split suffix is not part of the eval_name
    with pytest.raises(ValueError, match="only read with split='given'"):
        _fast(table=ImportConfig(path=tmp_path / "tr"), test_path=tmp_path / "te")


def test_given_split_from_a_split_column_and_its_errors(tmp_path):
    tab = synthetic_table(400)
    df = pd.DataFrame({"sample_id": tab.prompt_id, "prompt": tab.prompt,
                       "eval_name": np.where(np.arange(400) % 2 == 0, "algebra_set", "history_set"),
                       "split": np.where(np.arange(400) < 300, "train", "Test")})
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


def test_precomputed_embeddings_as_features(tmp_path):
    """A table with embedding columns: imported by prefix or as a list column, never as models, and the
    embedding featurizer routes on them (here they encode the topic, as a sentence encoder would)."""
    tab = synthetic_table(400)
    rng = np.random.default_rng(0)
    topic = np.array(["algebra" in p for p in tab.prompt], dtype=float)
    emb = np.column_stack([topic + 0.1 * rng.normal(size=400), rng.normal(size=(400, 3))])
    df = pd.DataFrame({"prompt": tab.prompt, **{m: tab.quality[:, k].astype(bool) for k, m in enumerate(tab.models)},
                       **{f"emb_{j}": emb[:, j] for j in range(4)}})
    df.loc[7, "emb_2"] = np.nan  # an embedding with a hole: the row is dropped, named
    df.to_csv(tmp_path / "t.csv")
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  cheap: {input_per_mtok: 0.5, output_per_mtok: 0.5}\n"
                      "  strong: {input_per_mtok: 10, output_per_mtok: 30}\n")
    imp = ImportConfig(path=tmp_path / "t.csv", embedding="emb_*", price_table=prices)
    t, rep = import_benchmark(imp, log=lambda s: None)
    assert t.models == ("cheap", "strong") and t.embedding.shape == (399, 4)
    assert [(d.row, d.column, d.reason) for d in rep.dropped] == [(8, "emb_2", "embedding value is missing or not "
                                                                               "a number")]
    # a list column (Parquet), the same numbers
    pq = df.drop(columns=[f"emb_{j}" for j in range(4)]).assign(embedding=list(np.nan_to_num(emb)))
    pq.to_parquet(tmp_path / "t.parquet")
    t2, _ = import_benchmark(ImportConfig(path=tmp_path / "t.parquet", embedding="embedding", price_table=prices),
                             log=lambda s: None)
    assert t2.embedding.shape == (400, 4) and np.allclose(t2.embedding[:7], emb[:7])
    with pytest.raises(BenchmarkImportError, match=r"t\.csv: column 'vec': no embedding column matches 'vec'"):
        import_benchmark(ImportConfig(path=tmp_path / "t.csv", embedding="vec", price_table=prices, strict=True),
                         log=lambda s: None)
    result, bundle = brun.run_benchmark(_fast(table=imp, featurizer="embedding"),
                                        log=lambda s: None)
    assert bundle.featurizer.name == "embedding" and result.aiq["knn"] > result.aiq["zero_router"]
    te = emb[300:310]
    assert bundle.route(list(tab.prompt[300:310]), 0.0, "knn", embeddings=te) == bundle.route(
        list(tab.prompt[300:310]), 0.0, "knn", embeddings=te)
    with pytest.raises(ValueError, match="pass embeddings"):
        bundle.route(["a prompt"], 0.0, "knn")
    # the embedding featurizer without imported embeddings: a clear error
    with pytest.raises(BenchmarkImportError, match="needs the table's precomputed embeddings"):
        brun.run_benchmark(_fast(table=ImportConfig(path=tmp_path / "t.csv", price_table=prices,
                                                    models=("cheap", "strong")),
                                 featurizer="embedding"), log=lambda s: None)


# ------------------------------------------------------------------ run_benchmark's phases, one by one
def test_split_and_features_phases():
    tab = synthetic_table(400)
    cfg = _fast()
    joined, tr, te, info = brun.split_prompts(tab, brun.ImportReport(source="t"), cfg, log=lambda s: None)
    assert joined is tab and info == {"split": "hash", "test_fraction": 0.25, "seed": 0}
    assert len(tr) + len(te) == 400 and not set(tr.prompt) & set(te.prompt)
    with pytest.raises(ValueError, match="t: .* a benchmark needs at least 10 of each"):
        brun.split_prompts(tab.take(np.arange(12)), brun.ImportReport(source="t"), cfg, log=lambda s: None)
    fx = brun.fit_features(tr, te, cfg, "t")
    assert len(fx.x_tr) == len(tr) and len(fx.x_te) == len(te) and fx.x_tr.shape[1] == fx.x_te.shape[1]
    assert np.array_equal(fx.x_te, fx.featurizer.transform(te.prompt))  # the featurizer fitted on train, kept
    assert fx.chars_te.tolist() == [float(len(p)) for p in te.prompt]
    with pytest.raises(BenchmarkImportError, match="needs the table's precomputed embeddings"):
        brun.fit_features(tr, te, _fast(featurizer="embedding"), "t")


def test_baseline_curves_phase():
    te = synthetic_table(300, seed=3)
    curves, kinds = brun.baseline_curves(te, te.models, br.RandomRouterConfig())
    assert list(curves) == [*te.models, "zero_router", "random", "oracle"] and list(kinds) == list(curves)
    assert kinds["oracle"] == "baseline (knows the outcomes)" and kinds["cheap"] == "single model"
    best_single = max(float(curves[m].quality[0]) for m in te.models)
    assert float(curves["oracle"].quality.max()) >= best_single


@pytest.fixture(scope="module")
def phases():
    tab = synthetic_table(600, seed=1)
    cfg = _fast()
    _, tr, te, _ = brun.split_prompts(tab, brun.ImportReport(source="t"), cfg, log=lambda s: None)
    fx = brun.fit_features(tr, te, cfg, "t")
    weights = br.cost_weights(tr.quality, tr.cost, cfg.weight_points)
    laps: list[str] = []
    routers = brun.train_routers(tr, fx, weights, tab.models, cfg, lambda s: None, laps.append)
    return cfg, tab, tr, te, fx, weights, routers, laps


def test_router_training_and_curve_phases(phases):
    cfg, tab, tr, te, fx, weights, routers, laps = phases
    assert laps == ["regression", "predictive", "knn", "bc", "cql"]
    assert routers.cql.metrics["behaviour"] == "uniform"
    pred = brun.predict_test(routers, tr, fx)
    assert set(pred.quality) == {"regression", "predictive", "knn"} and pred.cost.shape == (len(te), 2)
    assert np.allclose(pred.mean_quality, tr.quality.mean(axis=0))
    curves = brun.learned_curves(routers, pred, fx, te, weights, cfg.sweep_points)
    assert list(curves) == ["cost_only", "regression", "predictive", "knn", "bc", "cql"]
    assert len(curves["bc"].cost) == len(weights) and len(curves["regression"].cost) == cfg.sweep_points
    scores = brun.score_curves(curves | brun.baseline_curves(te, tab.models, cfg.random)[0], te, cfg)
    assert scores.aiq["oracle"] >= max(scores.aiq[n] for n in curves)
    assert scores.c_range == bm.cost_range(te.cost.mean(axis=0)) and "random" not in scores.margin_ci
    decided = brun.decisions_at(routers, pred, fx, 1e3)
    assert set(decided) == {"regression", "predictive", "knn", "cost_only", "bc", "cql"}
    assert all(d.shape == (len(te),) and set(np.unique(d)) <= {0, 1} for d in decided.values())


def test_routellm_phase_is_for_two_models_whose_strong_one_wins_on_test(phases):
    cfg, tab, tr, te, fx, _, routers, _ = phases
    pred = brun.predict_test(routers, tr, fx)
    metrics, pair = brun.routellm_scores(routers, pred, fx, tab.models, tr, te, log=lambda s: None)
    assert pair == ("strong", "cheap") and set(metrics) == {"random", "oracle", "regression", "predictive", "knn",
                                                            "bc", "cql"}
    assert metrics["oracle"].apgr >= metrics["random"].apgr
    assert brun.routellm_scores(routers, pred, fx, ("a", "b", "c"), tr, te, log=lambda s: None) == ({}, None)
    swapped = te.take(np.arange(len(te)))
    swapped.quality[:, 1] = 0.0  # the strong model never right on the test prompts
    lines: list[str] = []
    got = brun.routellm_scores(routers, pred, fx, tab.models, tr, swapped, lines.append)
    assert got == ({}, ("strong", "cheap"))
    assert "APGR and CPT are not defined" in lines[0]


# ------------------------------------------------------------------ the random router (issue 43)
def _shipped_table(name: str, folder: Path):
    """The tables the project ships or tests: RouteLLM's MMLU as packaged, its slice fixture, and synthetic
    many-model tables written in RouterBench's wide layout (pandas' index column included) and imported."""
    from sage_pipeline.routing_benchmark import synthetic as bs

    if name == "mmlu":
        return import_benchmark(ImportConfig(), log=lambda s: None)[0]
    if name == "slice":
        return import_benchmark(ImportConfig(path=SLICE), log=lambda s: None)[0]
    k, quality = name.removeprefix("syn").split("-")
    path, _ = bs.write_synthetic(folder, bs.SyntheticConfig(n_prompts=2000, n_models=int(k), quality=quality))
    return import_benchmark(ImportConfig(path=path, price_table=None), log=lambda s: None)[0]


@pytest.mark.parametrize("name", ["mmlu", "slice", "syn11-binary", "syn8-graded"])
def test_random_is_the_zero_router_on_every_shipped_table(name, tmp_path):
    """Random's reported AIQ is the zero router's, pooled and on every eval (its exact expectation: error 0);
    its draws, each scored on its own path, agree within their standard error; the hull of one draw's points,
    what rounds 1-3 reported, lies above."""
    tab = _shipped_table(name, tmp_path)
    te = tab.take(np.flatnonzero(brun.split_test(tab, 0.25, 0)))
    cfg = _fast(aiq_boot=40)
    curves, kinds = brun.baseline_curves(te, tab.models, cfg.random)
    scores = brun.score_curves(curves, te, cfg)
    assert kinds["random"] == brun.RANDOM_KIND and curves["random"].mixture
    assert scores.aiq["random"] == pytest.approx(scores.aiq["zero_router"], abs=1e-12)
    assert scores.aiq_by_eval and all(v["random"] == pytest.approx(v["zero_router"], abs=1e-12)
                                      for v in scores.aiq_by_eval.values())
    r = scores.random_router
    assert r["aiq"] == scores.aiq["random"] and r["draws"] == cfg.random.draws
    assert abs(r["draws_mean"] - scores.aiq["zero_router"]) < 4 * r["draws_se"]
    assert r["hull_of_one_draw_mean"] > scores.aiq["zero_router"] + 4 * r["draws_se"]
    # paired: on every resample the zero router's hull is at least random's expectation
    assert scores.margin_ci["zero_router"][0] >= -1e-12


def test_the_report_gives_random_as_its_expectation_and_per_eval_intervals(mmlu_run):
    result, _, paths, _ = mmlu_run
    assert result.aiq["random"] == pytest.approx(result.aiq["zero_router"], abs=1e-12)
    assert result.routellm["random"].apgr == pytest.approx(0.5) and result.routellm["random"].cpt50 == 0.5
    iv = result.eval_intervals
    assert set(iv.aiq) == set(result.aiq_by_eval) and set(iv.margins) == set(result.aiq_by_eval)
    for e, point in result.aiq_by_eval.items():
        assert set(iv.aiq[e]) == set(brun.EVAL_HEADS)
        for n, (lo, hi) in iv.aiq[e].items():
            assert lo - 1e-9 <= point[n] <= hi + 1e-9, (e, n)
        assert point["random"] == pytest.approx(point["zero_router"], abs=1e-12)
    for n, (lo, hi) in iv.mean.items():
        assert lo - 1e-9 <= result.aiq_eval_mean(n) <= hi + 1e-9, n
    lost = iv.not_separated("zero_router")
    for e, m in iv.margins.items():  # named: the evals whose paired interval over the zero router includes 0
        assert (e in lost) == (m["zero_router"][0] <= 0.0 <= m["zero_router"][1]), e
    md = brun.metadata_markdown(result)
    assert "Per-eval_name headline" in md["results"]
    assert "95% intervals from a bootstrap within each eval" in md["results"]
    assert f"in {len(lost)} of {len(iv.margins)} evals the paired interval includes 0" in md["results"]
    assert all(e in md["results"] for e in lost[:brun.NAMED_EVALS])
    assert "does NOT beat" not in md["results"] and "exact expectation" in md["results"]
    header = md["per_eval"].split("\n")[2]
    assert "recommended - zero_router" in header and md["per_eval"].count(" [") >= 5 * len(iv.aiq)
    report = json.loads(paths["report"].read_text())
    assert report["random_router"]["draws"] == result.config.random.draws
    assert report["aiq_by_eval_name_intervals"]["not_separated"]["zero_router"] == lost
    assert report["verdict_vs_random"] == result.verdict_vs_random


def test_the_verdict_never_says_the_zero_router_loses_to_random(mmlu_run):
    import dataclasses

    result = mmlu_run[0]
    sel = dataclasses.replace(result.selection, recommended="zero_router", fallback=True)
    zero = dataclasses.replace(result, selection=sel, recommended_margins={"random": (0.0, 0.0),
                                                                           "zero_router": (0.0, 0.0)})
    assert zero.verdict_vs_random.startswith("is the zero router's hull, which the random router equals")
    assert "ties the random router" in zero.verdict_vs_random and not zero.beats_random_router
    assert "ties the random router" in brun._summary(zero) and "does NOT" not in brun._summary(zero)
    say = {(0.01, 0.02): "beats the random router", (-0.01, 0.02): "is not separated from the random router",
           (-0.02, -0.01): "is below the random router"}
    learned = dataclasses.replace(result.selection, recommended="regression", fallback=False)
    for ci, words in say.items():
        other = dataclasses.replace(result, selection=learned, recommended_margins={"random": ci})
        assert other.verdict_vs_random.startswith(words), ci
