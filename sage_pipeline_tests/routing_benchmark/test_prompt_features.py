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


def test_character_ngrams_and_surface_features_are_served_as_fitted(tmp_path):
    """Issue 36: the stronger variant (word + character n-gram TF-IDF blocks, surface features) saves as
    plain arrays and serves exactly what scikit-learn fitted, on prompts it never saw."""
    rng = np.random.default_rng(0)
    words = np.array("solve the equation which king ruled history prime number 42 code def return".split())
    texts = np.array([" ".join(rng.choice(words, rng.integers(3, 15))) + ("\nA. yes\nB. no" if i % 3 else "")
                      for i in range(300)], dtype=object)
    cfg = bf.TfidfSvdConfig(n_components=12, char_ngram_max=4, add_surface=True)
    feat = bf.make_featurizer("tfidf_svd", **cfg.model_dump())
    x = feat.fit_transform(texts[:200])
    assert x.shape == (200, 12 + 1 + 4) and feat.dim == 17 and feat.char_vocabulary
    assert feat.idf.shape == (len(feat.vocabulary) + len(feat.char_vocabulary),)
    bf.save_featurizer(tmp_path, feat)
    loaded = bf.load_featurizer(tmp_path)
    np.testing.assert_allclose(loaded.transform(texts[200:]), feat.transform(texts[200:]), atol=1e-6)
    plain = bf.make_featurizer("tfidf_svd", n_components=12).fit(texts[:200])
    assert plain.char_vocabulary is None and plain.dim == 13


class _EmbeddingServer:
    """A local OpenAI-compatible /v1/embeddings endpoint: each text's embedding is a fixed function of it."""

    def __init__(self, dim: int = 6) -> None:
        import http.server
        import json
        import threading

        self.dim, self.calls = dim, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append((self.path, body["model"], len(body["input"])))
                data = [{"object": "embedding", "index": i, "embedding": outer.vector(t)}
                        for i, t in enumerate(body["input"])]
                raw = json.dumps({"object": "list", "data": data, "model": body["model"],
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def vector(self, text: str) -> list[float]:
        return [float(len(text)), float(text.count("a")), float(text.count(" ")), float(sum(map(ord, text)) % 97),
                float("?" in text), 1.0 + float(text[:1] == "W")][: self.dim]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_openai_compatible_embeddings_endpoint(tmp_path, monkeypatch):
    """Issue 36: an OpenAI-compatible embeddings endpoint as the prompt features, through the openai SDK,
    against a local test server: batched, standardised on the train prompts, saved without the key, served
    by the same endpoint; a dead endpoint or a changed model is an error naming the URL."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")
    server = _EmbeddingServer()
    try:
        texts = np.array([f"What is {i} + {i}? " + "a" * (i % 7) for i in range(50)], dtype=object)
        feat = bf.make_featurizer("openai_embedding", base_url=server.url, model="emb-test", batch_size=16)
        x = feat.fit_transform(texts)
        assert x.shape == (50, 6) and feat.dim == 6
        assert [c[2] for c in server.calls] == [16, 16, 16, 2] and server.calls[0][:2] == ("/v1/embeddings", "emb-test")
        np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-5)
        raw = np.array([server.vector(t) for t in texts])
        np.testing.assert_allclose(x[:, 0], (raw[:, 0] - raw[:, 0].mean()) / raw[:, 0].std(), atol=1e-5)
        bf.save_featurizer(tmp_path, feat)
        assert "sk-secret-123" not in (tmp_path / bf.FEATURES_JSON).read_text()
        loaded = bf.load_featurizer(tmp_path)
        np.testing.assert_allclose(loaded.transform(texts[:5]), x[:5], atol=1e-6)
        server.dim = 4  # the endpoint now serves another model
        with pytest.raises(RuntimeError, match="now returns 4 dimensions"):
            loaded.transform(texts[:3])
    finally:
        server.close()
    with pytest.raises(RuntimeError, match=f"{server.url}.*emb-test"):
        bf.make_featurizer("openai_embedding", base_url=server.url, model="emb-test", max_retries=0,
                           timeout_s=2).fit(texts)
    with pytest.raises(ValueError, match="needs openai_embedding.base_url"):
        bf.make_featurizer("openai_embedding")
