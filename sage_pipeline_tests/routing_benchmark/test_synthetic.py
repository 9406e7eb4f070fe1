"""Synthetic many-model tables: the catalogue's models and prices, known success probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.schema import ROLES
from sage_pipeline.routing_benchmark import synthetic as bs
from sage_pipeline.routing_benchmark.importer import ImportConfig, import_benchmark


def test_tables_import_as_shipped_with_the_catalogues_models_and_prices(tmp_path):
    path, p = bs.write_synthetic(tmp_path, bs.SyntheticConfig(n_prompts=400, n_models=8))
    tab, rep = import_benchmark(ImportConfig(path=path, price_table=None), log=lambda s: None)
    cat = ModelCatalogue.load()
    assert tab.models[:6] == cat.actions and tab.models[6:] == tuple(bs.EXTRA_MODELS)[:2]
    assert len(tab) == 400 and tab.binary_quality and rep.dropped_index_columns and rep.n_dropped == 0
    assert set(tab.eval_name) <= set(ROLES) and p.shape == (400, 8)
    # costs: the catalogue's per-call + per-1k-token prices; the dearest model costs 100x+ the cheapest
    mean = tab.cost.mean(axis=0)
    assert mean.max() / mean.min() > 100
    k = cat.actions.index("claude-opus-4")
    assert np.all(tab.cost[:, k] > cat.models[k].cost_per_call)
    # outcomes follow p: the observed success rate tracks the mean probability per model
    assert np.abs(tab.quality.mean(axis=0) - p.mean(axis=0)).max() < 0.08


def test_success_probability_is_the_simulators_law_and_the_text_shows_the_level():
    df, p = bs.make_synthetic(bs.SyntheticConfig(n_prompts=3000, n_models=11, hidden_noise=0.0, specialisation=0.0,
                                                 seed=3))
    models = [c for c in df.columns if c not in ("sample_id", "prompt", "eval_name") and "|" not in c]
    assert len(models) == 11
    level = df["prompt"].str.split().str[0].map({w: i for i, w in enumerate(bs.LEVELS)})
    assert level.notna().all()
    # harder levels: lower success for every model
    for k in range(11):
        assert np.corrcoef(level, p[:, k])[0, 1] < -0.5, models[k]
    # within a role, the model with the higher capability succeeds more often (the simulator's law)
    cap = np.nan_to_num(bs.catalogue_models(11).capability_matrix(), nan=bs.NO_SKILL)
    coder = (df["eval_name"] == "coder").to_numpy()
    order = np.argsort(cap[ROLES.index("coder")])
    assert np.all(np.diff(p[coder][:, order].mean(axis=0)) >= 0)
    graded, pg = bs.make_synthetic(bs.SyntheticConfig(n_prompts=2000, n_models=8, quality="graded", seed=1))
    q = graded[[c for c in graded.columns if c in models]].to_numpy()
    assert 0 <= q.min() and q.max() <= 1 and not np.isin(q, (0.0, 1.0)).all()
    assert np.abs(q.mean(axis=0) - pg.mean(axis=0)).max() < 0.03  # Beta draws with mean p
    with pytest.raises(ValueError, match="n_models"):
        bs.SyntheticConfig(n_models=12)
