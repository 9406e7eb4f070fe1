"""The recommended router (issue 36): chosen on a validation part of the train split, never on the test
prompts; it reads eval_name where a table has several; it falls back to the zero router's hull when
nothing beats it; BC and CQL are not offered as table routers; random's per-eval AIQ is on each eval's hull."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.routing_benchmark import (
    metrics as bm,
    prompt_features as bfeat,
    recommend as brec,
    routers as br,
    run as brun,
)
from sage_pipeline.routing_benchmark.importer import BenchmarkTable, ImportReport
from sage_pipeline_tests.routing_benchmark.test_run import _fast

MODELS = ("cheap", "mid", "strong")
WORDS = np.array("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split())


def evals_table(n: int, seed: int, evals: int = 4, within: bool = True, differ: bool = True) -> BenchmarkTable:
    """Three models, ``evals`` evals that the prompt text does not name. ``differ``: which model is worth
    its price depends on the eval (only eval_name tells); ``within``: a word in the text ('tricky' or
    'plain') moves every model's chance within an eval (only the text tells)."""
    rng = np.random.default_rng(seed)
    ev = rng.integers(0, evals, n)
    hard = rng.random(n) < 0.5
    base = np.array([[0.85, 0.88, 0.9], [0.2, 0.6, 0.9], [0.5, 0.85, 0.88], [0.1, 0.3, 0.9]])[ev % 4] if differ \
        else np.tile([0.5, 0.7, 0.85], (n, 1))
    shift = np.where(hard, -0.35, 0.25)[:, None] * np.array([1.0, 0.6, 0.1]) if within else 0.0
    p = np.clip(base + shift, 0.02, 0.98)
    quality = (rng.random((n, 3)) < p).astype(np.float64)
    text = [" ".join(rng.choice(WORDS, 6)) + (f" {'tricky' if h else 'plain'} " if within else " ")
            + " ".join(rng.choice(WORDS, 3)) + f" #{i}" for i, h in enumerate(hard)]
    chars = np.array([len(t) for t in text], dtype=np.float64)
    cost = np.column_stack([chars * 1e-7, chars * 1e-6, chars * 1e-5])
    return BenchmarkTable(np.array([f"p{i}" for i in range(n)], dtype=object), np.array(text, dtype=object),
                          np.array([f"eval{e}" for e in ev], dtype=object), MODELS, quality, cost,
                          np.zeros((n, 3), dtype=np.int8), np.zeros(n, dtype=np.int32), np.arange(1, n + 1),
                          ("t.csv",))


def _run(tab: BenchmarkTable, **kw):
    return brun.run_benchmark(_fast(**kw), log=lambda s: None, table=(tab, ImportReport(source="t.csv")))


@pytest.fixture(scope="module")
def both():
    """eval_name and the text both tell something: the recommendation must use both."""
    return _run(evals_table(3000, seed=1), tfidf_svd=bfeat.TfidfSvdConfig(n_components=128))


def test_metadata_and_text_recommend_a_router_that_beats_the_lookup_and_zero(both):
    result, bundle = both
    assert result.recommended not in ("zero_router", "random", br.LOOKUP)
    assert result.selection.validation_aiq[result.recommended] == max(result.selection.validation_aiq.values())
    for base in ("zero_router", "random", br.LOOKUP):
        lo, hi = result.recommended_margins[base]
        assert lo > 0, (base, lo, hi)
    assert result.beats_random_router and result.not_below_zero_router
    assert result.aiq[br.META] > result.aiq["regression"]  # eval_name as a feature pays on this table
    assert result.aiq[br.LOOKUP] > result.aiq["zero_router"]


def test_selection_never_reads_the_test_prompts():
    tab = evals_table(1600, seed=3)
    test = brun.split_test(tab, 0.25, 0)
    scrambled = tab.quality.copy()
    rng = np.random.default_rng(9)
    scrambled[test] = rng.permutation(scrambled[test])  # the test outcomes say something else entirely
    other = BenchmarkTable(tab.prompt_id, tab.prompt, tab.eval_name, tab.models, scrambled, tab.cost,
                           tab.cost_source, tab.file, tab.row, tab.files)
    a, _ = _run(tab)
    b, _ = _run(other)
    assert a.selection.to_dict() == b.selection.to_dict()
    assert a.aiq["recommended"] != b.aiq["recommended"]  # while the test score does move


def test_only_eval_name_tells_then_the_lookup_family_is_recommended():
    result, _ = _run(evals_table(2400, seed=4, within=False))
    assert result.recommended in {br.LOOKUP, br.META} or result.recommended.startswith("blend(")
    assert result.recommended_margins["zero_router"][0] > 0


def test_nothing_to_learn_falls_back_to_the_zero_routers_hull():
    result, bundle = _run(evals_table(1600, seed=5, within=False, differ=False))
    assert result.selection.fallback and result.recommended == "zero_router"
    assert result.aiq["recommended"] == result.aiq["zero_router"]
    assert result.recommended_margins["zero_router"] == (0.0, 0.0) and result.not_below_zero_router
    # random is the zero router's hull in expectation: the recommended hull ties it, never loses to it
    assert "random" not in result.selection.validation_aiq  # not a candidate: it is the zero router's hull
    assert result.aiq["random"] == pytest.approx(result.aiq["zero_router"], abs=1e-12)
    assert result.recommended_margins["random"][0] >= -1e-12 and not result.beats_random_router
    assert "ties the random router" in result.verdict_vs_random
    text = brun.metadata_markdown(result)["results"]
    assert "ties the random router" in text and "does NOT beat" not in text and "below the random" not in text
    with pytest.raises(ValueError, match="the recommended router is the zero_router"):
        bundle.route(["alpha beta"], 0.0, "recommended", eval_names=["eval0"])


def test_bc_and_cql_are_shown_for_ope_only(both):
    result, _ = both
    assert result.kinds["bc"] == result.kinds["cql"] == brun.OFFLINE_RL_KIND
    assert not {"bc", "cql"} & set(result.learned) and not {"bc", "cql"} & set(result.selection.validation_aiq)
    assert {r["policy"] for r in result.ope_rows} >= {"bc", "cql"}  # the OPE part still judges them
    assert "OPE" in brun.metadata_markdown(result)["results"]


def test_recommended_router_is_served_and_survives_a_reload(both, tmp_path):
    result, bundle = both
    paths, _ = brun.write_outputs(result, bundle, tmp_path / "reports", tmp_path / "ck")
    loaded = br.load_bundle(paths["checkpoint"])
    tab = evals_table(60, seed=11)
    for w in (0.0, 1e3):
        a = bundle.route(tab.prompt, w, "recommended", eval_names=tab.eval_name)
        assert a == loaded.route(tab.prompt, w, "recommended", eval_names=tab.eval_name)
        for name in (br.LOOKUP, br.META):
            assert bundle.route(tab.prompt, w, name, eval_names=tab.eval_name) == \
                loaded.route(tab.prompt, w, name, eval_names=tab.eval_name)
    assert loaded.recommended["name"] == result.recommended
    with pytest.raises(ValueError, match="pass eval_names"):
        loaded.route(tab.prompt, 0.0, br.LOOKUP)
    with pytest.raises(ValueError, match="2 entries for 60 prompts"):
        loaded.route(tab.prompt, 0.0, br.META, eval_names=["eval0", "eval1"])


def test_random_per_eval_is_scored_on_that_evals_own_hull():
    """Pooled, the mid model is off the hull; within eval A it is the only sensible model. Random's
    per-eval AIQ must mix eval A's own hull, not the pooled one."""
    rng = np.random.default_rng(0)
    n = 400
    group = np.where(np.arange(n) < 200, "A", "B").astype(object)
    q = np.where(group[:, None] == "A", [0.1, 0.9, 0.95], [0.9, 0.1, 0.95])
    q = (rng.random((n, 3)) < q).astype(float)
    c = np.tile([1.0, 2.0, 10.0], (n, 1))
    pooled_random = br.random_router_curve(q, c)
    zero = br.zero_router_curve(q, c)
    out = bm.aiq_by_group({"random": pooled_random, "zero_router": zero}, q, c, group,
                          recompute={"random": lambda qq, cc: br.random_router_curve(qq, cc)})
    a = np.flatnonzero(group == "A")
    own = br.random_router_curve(q[a], c[a])
    lo, hi = bm.cost_range(c[a].mean(axis=0))
    assert out["A"]["random"] == pytest.approx(own.aiq(lo, hi))
    assert out["A"]["random"] == pytest.approx(out["A"]["zero_router"], abs=1e-12)  # its expectation: A's own hull
    held = bm.aiq_by_group({"random": pooled_random}, q, c, group)["A"]["random"]
    assert out["A"]["random"] > held + 0.05  # the pooled mixture wastes eval A's prompts on the cheap model


def test_recommend_config_errors():
    with pytest.raises(ValueError, match="validation_fraction"):
        brec.RecommendConfig(validation_fraction=1.0)
    with pytest.raises(ValueError, match="blend_shares.1"):  # the lookup's share in a blend is in (0, 1)
        brec.RecommendConfig(blend_shares=[0.5, 1.5])
    tab = evals_table(40, seed=2)
    with pytest.raises(ValueError, match="at least 10 fit and 10 validation prompts"):
        _run(tab, test_fraction=0.5, recommend=brec.RecommendConfig(validation_fraction=0.05))


def test_a_table_shaped_like_the_published_ones(tmp_path):
    """11 models, pandas' index column, several evals, rows with missing cells, the table's own split column:
    the recommended router beats the zero router and random, and is never below the lookup beyond its
    interval. (On this table routing by the true success probabilities beats the lookup by only ~0.002
    AIQ: each role's best model hardly changes with a prompt's level, so there is little for the text to
    add; evals_table above is where it adds, and there the recommendation beats the lookup.)"""

    from sage_pipeline.routing_benchmark import synthetic as bs
    from sage_pipeline.routing_benchmark.importer import ImportConfig

    df, _ = bs.make_synthetic(bs.SyntheticConfig(n_prompts=3000, n_models=11, seed=3))
    models = [c for c in df.columns if c not in ("sample_id", "prompt", "eval_name") and "|" not in c]
    df.loc[df.index[::97], models[4]] = np.nan  # 31 rows with a missing quality
    df["split"] = np.where(np.arange(len(df)) % 4 == 0, "test", "train")
    path = tmp_path / "routerbench_like.csv"
    df.to_csv(path)
    result, _ = brun.run_benchmark(_fast(table=ImportConfig(path=path, price_table=None), split="given"),
                                   log=lambda s: None)
    assert len(result.models) == 11 and result.import_report.n_dropped == 31
    assert len(result.aiq_by_eval) == 8 and result.split_info["split"] == "given"
    assert result.recommended_margins["zero_router"][0] > 0 and result.recommended_margins["random"][0] > 0
    assert result.recommended_margins[br.LOOKUP][1] >= 0, result.recommended_margins
