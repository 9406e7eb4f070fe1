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
    max_features: int = Field(50_000, ge=1, description="TF-IDF vocabulary size at most (per block: words, "
                              "character n-grams)")
    min_df: int = Field(2, ge=1, description="a term must occur in this many train prompts")
    ngram_max: int = Field(1, ge=1, description="1: words; 2: words and word pairs")
    char_ngram_max: int = Field(0, ge=0, description="0: no character n-grams; N >= 2: a second TF-IDF block of "
                                "character 2..N-grams within word boundaries (scikit-learn's char_wb), stacked "
                                "beside the words' before the SVD")
    sublinear_tf: bool = Field(True, description="1 + log(tf) instead of tf")
    add_length: bool = Field(True, description="append log(1 + characters)")
    add_surface: bool = Field(False, description="append the length featurizer's standardised surface features "
                              "(log words, share of digits, lines, answer options; log characters too when "
                              "add_length is off)")
    seed: int = Field(0, description="seed of the truncated SVD")


class TfidfSvdFeaturizer:
    """TF-IDF (words, and optionally character n-grams: one L2-normalised block each) + truncated SVD
    (scikit-learn), standardised; + log prompt length (+ surface features)."""

    name = "tfidf_svd"

    def __init__(self, config: TfidfSvdConfig = TfidfSvdConfig(), *, vocabulary: list[str] | None = None,
                 idf: np.ndarray | None = None, components: np.ndarray | None = None,
                 mean: np.ndarray | None = None, scale: np.ndarray | None = None,
                 char_vocabulary: list[str] | None = None, surface: LengthFeaturizer | None = None) -> None:
        self.config = config
        self.vocabulary, self.idf, self.components, self.mean, self.scale = vocabulary, idf, components, mean, scale
        self.char_vocabulary, self.surface = char_vocabulary, surface

    @property
    def dim(self) -> int:
        if self.components is None:
            raise ValueError("tfidf_svd featurizer is not fitted: call fit(train prompts) first")
        return self.components.shape[0] + int(self.config.add_length) + (self._surface_dim() if self.surface else 0)

    def _surface_dim(self) -> int:
        return 5 if not self.config.add_length else 4

    def _blocks(self) -> list[dict]:
        """The vectorizer arguments of each TF-IDF block."""
        c = self.config
        out = [{"lowercase": True, "ngram_range": (1, c.ngram_max), "dtype": np.float64}]
        if c.char_ngram_max >= 2:
            out.append({"lowercase": True, "analyzer": "char_wb", "ngram_range": (2, c.char_ngram_max),
                        "dtype": np.float64})
        return out

    def _extras(self, texts: np.ndarray) -> list[np.ndarray]:
        cols = [_log_length(texts)[:, None]] if self.config.add_length else []
        if self.surface is not None:
            z = self.surface.transform(texts)
            cols.append(z[:, 1:] if self.config.add_length else z)  # log characters once
        return cols

    def fit(self, texts: np.ndarray) -> TfidfSvdFeaturizer:
        self.fit_transform(texts)
        return self

    def fit_transform(self, texts: np.ndarray) -> np.ndarray:
        """Fit on ``texts`` and return their features (scikit-learn's own, which the served
        transform reproduces: checked on up to 500 of them)."""
        import scipy.sparse as sp
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        texts = np.asarray(texts, dtype=object)
        if len(texts) < 2:
            raise ValueError(f"tfidf_svd needs at least 2 train prompts, got {len(texts)}")
        c = self.config
        vecs = [TfidfVectorizer(sublinear_tf=c.sublinear_tf, min_df=min(c.min_df, max(1, len(texts) // 2)),
                                max_features=c.max_features, **args) for args in self._blocks()]
        x = sp.hstack([v.fit_transform(texts) for v in vecs]).tocsr()
        k = max(1, min(c.n_components, x.shape[1] - 1, x.shape[0] - 1))
        svd = TruncatedSVD(k, random_state=c.seed)
        z = svd.fit_transform(x)
        self.vocabulary = vecs[0].get_feature_names_out().tolist()
        self.char_vocabulary = vecs[1].get_feature_names_out().tolist() if len(vecs) > 1 else None
        self.idf = np.concatenate([v.idf_ for v in vecs]).astype(np.float64)
        self.components = svd.components_.astype(np.float32)  # served (and saved) in float32
        self.mean = z.mean(axis=0)
        self.scale = np.where(z.std(axis=0) > 1e-12, z.std(axis=0), 1.0)
        self.surface = LengthFeaturizer().fit(texts) if c.add_surface else None
        z = (z - self.mean) / self.scale
        out = np.hstack([z] + self._extras(texts)).astype(np.float32)
        check = min(len(texts), 500)
        diff = float(np.abs(self.transform(texts[:check]) - out[:check]).max())
        if diff > SERVING_ATOL:
            raise RuntimeError(f"tfidf_svd: served features differ from scikit-learn's by {diff:.2e}")
        return out

    def transform(self, texts: np.ndarray) -> np.ndarray:
        import scipy.sparse as sp
        from sklearn.feature_extraction.text import CountVectorizer

        if self.components is None:
            raise ValueError("tfidf_svd featurizer is not fitted: call fit(train prompts) first")
        texts = np.asarray(texts, dtype=object)
        vocabs = [self.vocabulary] + ([self.char_vocabulary] if self.char_vocabulary is not None else [])
        blocks, start = [], 0
        for vocab, args in zip(vocabs, self._blocks()):
            counts = CountVectorizer(vocabulary={t: i for i, t in enumerate(vocab)},
                                     **args).transform(texts).astype(np.float64)
            if self.config.sublinear_tf:
                counts.data = 1.0 + np.log(counts.data)
            tfidf = counts.multiply(self.idf[None, start:start + len(vocab)]).tocsr()
            norms = np.sqrt(np.asarray(tfidf.multiply(tfidf).sum(axis=1)).ravel())
            blocks.append(tfidf.multiply(1.0 / np.where(norms > 0, norms, 1.0)[:, None]).tocsr())
            start += len(vocab)
        tfidf = sp.hstack(blocks).tocsr()
        z = (np.asarray(tfidf @ self.components.T.astype(np.float64)) - self.mean) / self.scale
        return np.hstack([z] + self._extras(texts)).astype(np.float32)

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"name": self.name, "config": self.config.model_dump(), "vocabulary": self.vocabulary,
                "char_vocabulary": self.char_vocabulary}
        arrays = {"idf": self.idf, "components": self.components, "mean": self.mean, "scale": self.scale}
        if self.surface is not None:
            arrays |= {"surface_mean": self.surface.mean, "surface_scale": self.surface.scale}
        return meta, arrays

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> TfidfSvdFeaturizer:
        surface = (LengthFeaturizer(arrays["surface_mean"], arrays["surface_scale"])
                   if "surface_mean" in arrays else None)
        chars = meta.get("char_vocabulary")
        return cls(TfidfSvdConfig(**meta["config"]), vocabulary=list(meta["vocabulary"]), idf=arrays["idf"],
                   components=arrays["components"], mean=arrays["mean"], scale=arrays["scale"],
                   char_vocabulary=None if chars is None else list(chars), surface=surface)


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


class OpenAIEmbeddingConfig(BaseModel):
    """An OpenAI-compatible embeddings endpoint (the ``openai`` SDK's ``embeddings.create``), for users who
    have one: vLLM, Ollama's /v1, text-embeddings-inference, OpenAI itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field("", description="the endpoint's base URL, e.g. http://localhost:8000/v1 (required for "
                          "featurizer openai_embedding)")
    model: str = Field("", description="the embedding model's name as the endpoint knows it (required)")
    api_key_env: str = Field("OPENAI_API_KEY", min_length=1, description="environment variable holding the API "
                             "key (a placeholder is sent when it is unset: local servers ignore it)")
    batch_size: int = Field(128, ge=1, description="prompts per request")
    timeout_s: float = Field(60.0, gt=0.0, description="seconds per request")
    max_retries: int = Field(2, ge=0, description="the SDK's retries of a failed request")


class OpenAIEmbeddingFeaturizer:
    """Prompt embeddings from an OpenAI-compatible endpoint, standardised with the train split's mean and
    scale. Saved as the endpoint's URL and model plus the scaling (the key is never saved); serving calls
    the same endpoint."""

    name = "openai_embedding"

    def __init__(self, config: OpenAIEmbeddingConfig | None = None, mean: np.ndarray | None = None,
                 scale: np.ndarray | None = None, **params) -> None:
        self.config = config or OpenAIEmbeddingConfig(**params)
        if not self.config.base_url or not self.config.model:
            raise ValueError("featurizer openai_embedding needs openai_embedding.base_url (e.g. "
                             "http://localhost:8000/v1) and openai_embedding.model")
        self.mean, self.scale = mean, scale

    @property
    def dim(self) -> int:
        if self.mean is None:
            raise ValueError("openai_embedding featurizer is not fitted: call fit(train prompts) first")
        return len(self.mean)

    def _embed(self, texts: np.ndarray) -> np.ndarray:
        import os

        import openai

        c = self.config
        client = openai.OpenAI(base_url=c.base_url, api_key=os.environ.get(c.api_key_env) or "unused",
                               timeout=c.timeout_s, max_retries=c.max_retries)
        out: list[list[float]] = []
        texts = [str(t) if str(t) else " " for t in texts]  # an empty input is refused by most servers
        for i in range(0, len(texts), c.batch_size):
            batch = texts[i:i + c.batch_size]
            try:
                resp = client.embeddings.create(model=c.model, input=batch)
            except openai.OpenAIError as e:
                raise RuntimeError(f"openai_embedding: {c.base_url} (model {c.model!r}) failed on prompts "
                                   f"{i}..{i + len(batch) - 1}: {type(e).__name__}: {e}. Check the URL, the model "
                                   f"name and ${c.api_key_env}, or use featurizer tfidf_svd") from e
            data = sorted(resp.data, key=lambda d: d.index)
            if len(data) != len(batch):
                raise RuntimeError(f"openai_embedding: {c.base_url} returned {len(data)} embeddings for "
                                   f"{len(batch)} prompts (model {c.model!r})")
            out += [d.embedding for d in data]
        x = np.asarray(out, dtype=np.float64)
        if x.ndim != 2 or not np.isfinite(x).all():
            raise RuntimeError(f"openai_embedding: {c.base_url} returned embeddings of ragged or non-finite "
                               f"values (model {c.model!r})")
        return x

    def fit(self, texts: np.ndarray) -> OpenAIEmbeddingFeaturizer:
        self.fit_transform(texts)
        return self

    def fit_transform(self, texts: np.ndarray) -> np.ndarray:
        x = self._embed(np.asarray(texts, dtype=object))
        self.mean, sd = x.mean(axis=0), x.std(axis=0)
        self.scale = np.where(sd > 1e-12, sd, 1.0)
        return ((x - self.mean) / self.scale).astype(np.float32)

    def transform(self, texts: np.ndarray) -> np.ndarray:
        if self.mean is None:
            raise ValueError("openai_embedding featurizer is not fitted: call fit(train prompts) first")
        x = self._embed(np.asarray(texts, dtype=object))
        if x.shape[1] != len(self.mean):
            raise RuntimeError(f"openai_embedding: {self.config.base_url} (model {self.config.model!r}) now returns "
                               f"{x.shape[1]} dimensions; the router was fitted on {len(self.mean)}: the endpoint "
                               "serves another model, so re-materialize routing_benchmark")
        return ((x - self.mean) / self.scale).astype(np.float32)

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        return {"name": self.name, "config": self.config.model_dump()}, {"mean": self.mean, "scale": self.scale}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> OpenAIEmbeddingFeaturizer:
        return cls(OpenAIEmbeddingConfig(**meta["config"]), arrays["mean"], arrays["scale"])


def takes_embeddings(featurizer: PromptFeaturizer) -> bool:
    """Whether the featurizer reads precomputed embeddings instead of the prompt text."""
    return getattr(featurizer, "input", "text") == "embedding"


FEATURIZERS: dict[str, type] = {"tfidf_svd": TfidfSvdFeaturizer, "length": LengthFeaturizer,
                                "embedding": EmbeddingFeaturizer, "openai_embedding": OpenAIEmbeddingFeaturizer}


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
