"""Prompt features for benchmark routers: pluggable, fitted on the train split only, saved with the router.

A featurizer turns prompt texts (or, for ``embedding``, the table's precomputed prompt
embeddings) into a float32 matrix. The default, ``tfidf_svd``, is
scikit-learn's ``TfidfVectorizer`` followed by ``TruncatedSVD`` (latent semantic
analysis), standardised with the train split's mean and scale, plus the log of the prompt
length. It is saved as plain arrays (vocabulary, idf, SVD components, scaling) and
served by re-applying them through a ``CountVectorizer`` with the fitted vocabulary, so
loading needs no pickle; :meth:`TfidfSvdFeaturizer.fit` checks that the served features
equal scikit-learn's to 1e-4.

Add a featurizer by implementing :class:`PromptFeaturizer` and registering it in
:data:`FEATURIZERS` (``register_featurizer``); the routing_benchmark asset picks it by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts

FEATURES_JSON = "features.json"
FEATURES_NPZ = "features.npz"
SERVING_ATOL = 1e-4


class PromptFeaturizer(Protocol):
    name: str

    @property
    def dim(self) -> int: ...

    def fit(self, texts: np.ndarray) -> PromptFeaturizer: ...

    def fit_transform(self, texts: np.ndarray) -> np.ndarray: ...

    def transform(self, texts: np.ndarray) -> np.ndarray: ...

    def state(self) -> tuple[dict, dict[str, np.ndarray]]: ...

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> PromptFeaturizer: ...


def _log_length(texts: np.ndarray) -> np.ndarray:
    return np.log1p(np.fromiter((len(t) for t in texts), dtype=np.float64, count=len(texts)))


class TfidfSvdConfig(BaseModel):
    """The tfidf_svd featurizer's settings (saved in its features.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_components: int = Field(128, ge=1, description="SVD dimensions")
    max_features: int = Field(50_000, ge=1, description="TF-IDF vocabulary size at most")
    min_df: int = Field(2, ge=1, description="a term must occur in this many train prompts")
    ngram_max: int = Field(1, ge=1, description="1: words; 2: words and word pairs")
    sublinear_tf: bool = Field(True, description="1 + log(tf) instead of tf")
    add_length: bool = Field(True, description="append log(1 + characters)")
    seed: int = Field(0, description="seed of the truncated SVD")


class TfidfSvdFeaturizer:
    """TF-IDF + truncated SVD (scikit-learn), standardised; + log prompt length."""

    name = "tfidf_svd"

    def __init__(self, config: TfidfSvdConfig = TfidfSvdConfig(), *, vocabulary: list[str] | None = None,
                 idf: np.ndarray | None = None, components: np.ndarray | None = None,
                 mean: np.ndarray | None = None, scale: np.ndarray | None = None) -> None:
        self.config = config
        self.vocabulary, self.idf, self.components, self.mean, self.scale = vocabulary, idf, components, mean, scale

    @property
    def dim(self) -> int:
        if self.components is None:
            raise ValueError("tfidf_svd featurizer is not fitted: call fit(train prompts) first")
        return self.components.shape[0] + int(self.config.add_length)

    def _token_args(self) -> dict:
        return {"lowercase": True, "ngram_range": (1, self.config.ngram_max), "dtype": np.float64}

    def fit(self, texts: np.ndarray) -> TfidfSvdFeaturizer:
        self.fit_transform(texts)
        return self

    def fit_transform(self, texts: np.ndarray) -> np.ndarray:
        """Fit on ``texts`` and return their features (scikit-learn's own, which the served
        transform reproduces: checked on up to 500 of them)."""
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        texts = np.asarray(texts, dtype=object)
        if len(texts) < 2:
            raise ValueError(f"tfidf_svd needs at least 2 train prompts, got {len(texts)}")
        c = self.config
        vec = TfidfVectorizer(sublinear_tf=c.sublinear_tf, min_df=min(c.min_df, max(1, len(texts) // 2)),
                              max_features=c.max_features, **self._token_args())
        x = vec.fit_transform(texts)
        k = max(1, min(c.n_components, x.shape[1] - 1, x.shape[0] - 1))
        svd = TruncatedSVD(k, random_state=c.seed)
        z = svd.fit_transform(x)
        self.vocabulary = vec.get_feature_names_out().tolist()
        self.idf = vec.idf_.astype(np.float64)
        self.components = svd.components_.astype(np.float32)  # served (and saved) in float32
        self.mean = z.mean(axis=0)
        self.scale = np.where(z.std(axis=0) > 1e-12, z.std(axis=0), 1.0)
        z = (z - self.mean) / self.scale
        out = np.hstack([z] + ([_log_length(texts)[:, None]] if c.add_length else [])).astype(np.float32)
        check = min(len(texts), 500)
        diff = float(np.abs(self.transform(texts[:check]) - out[:check]).max())
        if diff > SERVING_ATOL:
            raise RuntimeError(f"tfidf_svd: served features differ from scikit-learn's by {diff:.2e}")
        return out

    def transform(self, texts: np.ndarray) -> np.ndarray:
        from sklearn.feature_extraction.text import CountVectorizer

        if self.components is None:
            raise ValueError("tfidf_svd featurizer is not fitted: call fit(train prompts) first")
        texts = np.asarray(texts, dtype=object)
        counts = CountVectorizer(vocabulary={t: i for i, t in enumerate(self.vocabulary)},
                                 **self._token_args()).transform(texts).astype(np.float64)
        if self.config.sublinear_tf:
            counts.data = 1.0 + np.log(counts.data)
        tfidf = counts.multiply(self.idf[None, :]).tocsr()
        norms = np.sqrt(np.asarray(tfidf.multiply(tfidf).sum(axis=1)).ravel())
        tfidf = tfidf.multiply(1.0 / np.where(norms > 0, norms, 1.0)[:, None]).tocsr()
        z = (np.asarray(tfidf @ self.components.T.astype(np.float64)) - self.mean) / self.scale
        cols = [z] + ([_log_length(texts)[:, None]] if self.config.add_length else [])
        return np.hstack(cols).astype(np.float32)

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"name": self.name, "config": self.config.model_dump(), "vocabulary": self.vocabulary}
        return meta, {"idf": self.idf, "components": self.components, "mean": self.mean, "scale": self.scale}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> TfidfSvdFeaturizer:
        return cls(TfidfSvdConfig(**meta["config"]), vocabulary=list(meta["vocabulary"]), idf=arrays["idf"],
                   components=arrays["components"], mean=arrays["mean"], scale=arrays["scale"])


class LengthFeaturizer:
    """Surface features only (no vocabulary): log characters, log words, share of digits, lines,
    answer options. A baseline that shows what the text model adds."""

    name = "length"

    def __init__(self, mean: np.ndarray | None = None, scale: np.ndarray | None = None) -> None:
        self.mean, self.scale = mean, scale

    @property
    def dim(self) -> int:
        return 5

    @staticmethod
    def _raw(texts: np.ndarray) -> np.ndarray:
        rows = [(np.log1p(len(t)), np.log1p(len(t.split())), sum(ch.isdigit() for ch in t) / max(len(t), 1),
                 t.count("\n"), sum(t.count(f"\n{o}.") for o in "ABCDEFGH")) for t in texts]
        return np.asarray(rows, dtype=np.float64).reshape(len(texts), 5)

    def fit(self, texts: np.ndarray) -> LengthFeaturizer:
        x = self._raw(texts)
        self.mean, sd = x.mean(axis=0), x.std(axis=0)
        self.scale = np.where(sd > 1e-12, sd, 1.0)
        return self

    def fit_transform(self, texts: np.ndarray) -> np.ndarray:
        return self.fit(texts).transform(texts)

    def transform(self, texts: np.ndarray) -> np.ndarray:
        if self.mean is None:
            raise ValueError("length featurizer is not fitted: call fit(train prompts) first")
        return ((self._raw(texts) - self.mean) / self.scale).astype(np.float32)

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        return {"name": self.name}, {"mean": self.mean, "scale": self.scale}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> LengthFeaturizer:
        return cls(arrays["mean"], arrays["scale"])


class EmbeddingFeaturizer:
    """Precomputed prompt embeddings (the table's ``embedding`` columns: ImportConfig.embedding),
    standardised with the train split's mean and scale. Its input is the (n, d) embedding matrix,
    not the text (``takes_embeddings``)."""

    name = "embedding"
    input = "embedding"

    def __init__(self, mean: np.ndarray | None = None, scale: np.ndarray | None = None) -> None:
        self.mean, self.scale = mean, scale

    @property
    def dim(self) -> int:
        if self.mean is None:
            raise ValueError("embedding featurizer is not fitted: call fit(train embeddings) first")
        return len(self.mean)

    def fit(self, emb: np.ndarray) -> EmbeddingFeaturizer:
        x = self._check(emb)
        self.mean, sd = x.mean(axis=0), x.std(axis=0)
        self.scale = np.where(sd > 1e-12, sd, 1.0)
        return self

    def fit_transform(self, emb: np.ndarray) -> np.ndarray:
        return self.fit(emb).transform(emb)

    def transform(self, emb: np.ndarray) -> np.ndarray:
        if self.mean is None:
            raise ValueError("embedding featurizer is not fitted: call fit(train embeddings) first")
        x = self._check(emb)
        if x.shape[1] != len(self.mean):
            raise ValueError(f"embedding featurizer: expected {len(self.mean)} dimensions, got {x.shape[1]}")
        return ((x - self.mean) / self.scale).astype(np.float32)

    @staticmethod
    def _check(emb) -> np.ndarray:
        x = np.asarray(emb, dtype=np.float64)
        if x.ndim != 2 or not np.isfinite(x).all():
            raise ValueError(f"embedding featurizer: expected a finite (n, d) array of embeddings, got shape "
                             f"{x.shape}")
        return x

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        return {"name": self.name}, {"mean": self.mean, "scale": self.scale}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> EmbeddingFeaturizer:
        return cls(arrays["mean"], arrays["scale"])


def takes_embeddings(featurizer: PromptFeaturizer) -> bool:
    """Whether the featurizer reads precomputed embeddings instead of the prompt text."""
    return getattr(featurizer, "input", "text") == "embedding"


FEATURIZERS: dict[str, type] = {"tfidf_svd": TfidfSvdFeaturizer, "length": LengthFeaturizer,
                                "embedding": EmbeddingFeaturizer}


def register_featurizer(name: str, cls: type) -> None:
    """Make ``cls`` (a :class:`PromptFeaturizer`) available by ``name`` to make/load_featurizer."""
    FEATURIZERS[name] = cls


def make_featurizer(name: str = "tfidf_svd", **params) -> PromptFeaturizer:
    if name not in FEATURIZERS:
        raise ValueError(f"unknown featurizer {name!r}: use one of {sorted(FEATURIZERS)} "
                         "(or register_featurizer your own)")
    if name == "tfidf_svd":
        return TfidfSvdFeaturizer(TfidfSvdConfig(**params))
    return FEATURIZERS[name](**params)


def save_featurizer(folder: str | Path, featurizer: PromptFeaturizer) -> None:
    """Write ``features.json`` + ``features.npz`` into ``folder`` (atomically each)."""
    meta, arrays = featurizer.state()
    folder = Path(folder)
    artifacts.write_json(folder / FEATURES_JSON, meta)
    with artifacts.atomic_open(folder / FEATURES_NPZ, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def load_featurizer(folder: str | Path) -> PromptFeaturizer:
    folder = Path(folder)
    pj = folder / FEATURES_JSON
    if not pj.is_file():
        raise FileNotFoundError(f"{folder}: {FEATURES_JSON} not found (materialize routing_benchmark first)")
    meta = json.loads(pj.read_text(encoding="utf-8"))
    if meta.get("name") not in FEATURIZERS:
        raise ValueError(f"{pj}: featurizer {meta.get('name')!r} is not registered here "
                         f"(known: {sorted(FEATURIZERS)})")
    with np.load(folder / FEATURES_NPZ) as z:
        arrays = {k: z[k] for k in z.files}
    return FEATURIZERS[meta["name"]].from_state(meta, arrays)
