"""Prompt featurizers: fitted on train prompts only, served from plain arrays, pluggable."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.routing_benchmark import prompt_features as bf

TRAIN = np.array(["solve the equation x + 1 = 2", "who was the first king of France", "solve for y in 2y = 4",
                  "the king and the queen of Spain", "integrate x squared", "history of the roman empire"] * 3,
                 dtype=object)


def test_tfidf_svd_is_fitted_on_train_only_and_served_like_scikit_learn(tmp_path):
    f = bf.make_featurizer("tfidf_svd", n_components=4)
    x = f.fit_transform(TRAIN)
    assert x.shape == (len(TRAIN), 5) and x.dtype == np.float32 and f.dim == 5
    assert np.allclose(x[:, :4].mean(axis=0), 0, atol=1e-5) and np.allclose(x[:, :4].std(axis=0), 1, atol=1e-4)
    assert "zebra" not in f.vocabulary  # a test-only word is not in the vocabulary
    test = np.array(["zebra zebra zebra", "solve the king"], dtype=object)
    assert np.allclose(f.transform(test), f.transform(test))
    assert np.allclose(f.transform(test)[0, :4], -f.mean / f.scale, atol=1e-5)  # unknown words: the zero vector
    bf.save_featurizer(tmp_path, f)
    g = bf.load_featurizer(tmp_path)
    assert isinstance(g, bf.TfidfSvdFeaturizer) and np.array_equal(g.transform(test), f.transform(test))
    assert np.allclose(g.transform(TRAIN), x, atol=1e-4)


def test_unfitted_unknown_and_registered_featurizers(tmp_path):
    with pytest.raises(ValueError, match="not fitted"):
        bf.make_featurizer("tfidf_svd").transform(TRAIN)
    with pytest.raises(ValueError, match="unknown featurizer 'bert'"):
        bf.make_featurizer("bert")
    with pytest.raises(ValueError, match="at least 2 train prompts"):
        bf.make_featurizer("tfidf_svd").fit(TRAIN[:1])

    class Upper(bf.LengthFeaturizer):
        name = "upper"

    bf.register_featurizer("upper", Upper)
    try:
        u = bf.make_featurizer("upper")
        x = u.fit_transform(TRAIN)
        bf.save_featurizer(tmp_path, u)
        assert isinstance(bf.load_featurizer(tmp_path), Upper) and x.shape == (len(TRAIN), 5)
    finally:
        del bf.FEATURIZERS["upper"]
    with pytest.raises(ValueError, match="featurizer 'upper' is not registered"):
        bf.load_featurizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="features.json not found"):
        bf.load_featurizer(tmp_path / "none")
