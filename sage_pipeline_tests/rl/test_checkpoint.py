"""Checkpoint format: atomic save, numpy serving, mismatch errors that say what differs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sage_pipeline.rl.checkpoint import (
    CheckpointError,
    CheckpointMeta,
    load_policy,
    masked_greedy,
    masked_softmax,
    save_checkpoint,
)
from sage_pipeline.routing.features import Contexts, FeatureSpec


def _net(rng, spec, k, hidden=8):
    return [(rng.normal(size=(hidden, spec.dim)).astype(np.float32), rng.normal(size=hidden).astype(np.float32)),
            (rng.normal(size=(k, hidden)).astype(np.float32), rng.normal(size=k).astype(np.float32))]


def _ctx(n, rng):
    return Contexts(role=rng.integers(0, 8, n), task_complexity_score=rng.random(n),
                    prompt_tokens=rng.integers(200, 9000, n).astype(float), step=np.zeros(n, int),
                    failure_count=np.zeros(n, int), primary_failure_count=np.zeros(n, int))


def _meta(catalogue, spec, **kw):
    return CheckpointMeta(kind="test", feature_spec=spec.to_dict(), actions=list(catalogue.actions),
                          role_mask=catalogue.role_mask().tolist(), **kw)


def test_round_trip_serves_the_same_probabilities(tmp_path, catalogue):
    rng, spec = np.random.default_rng(0), FeatureSpec()
    nets = [_net(rng, spec, len(catalogue.actions)) for _ in range(2)]
    save_checkpoint(tmp_path / "ck", _meta(catalogue, spec, head="greedy"), nets)
    pol = load_policy(tmp_path / "ck", spec, catalogue.actions)
    ctx = _ctx(50, rng)
    x = spec.encode(ctx)
    q = np.mean([np.maximum(x @ n[0][0].T + n[0][1], 0) @ n[1][0].T + n[1][1] for n in nets], axis=0)
    mask = catalogue.role_mask()[ctx.role]
    np.testing.assert_allclose(pol.outputs(ctx), q, rtol=1e-5, atol=1e-5)
    probs = pol.action_probs(ctx)
    assert (probs[~mask] == 0).all() and np.allclose(probs.sum(1), 1)
    assert (probs.argmax(1) == np.where(mask, q, -np.inf).argmax(1)).all()


def test_masked_heads_never_choose_a_masked_action():
    vals = np.array([[5.0, 1.0, 0.0], [0.0, 2.0, 9.0]])
    mask = np.array([[False, True, True], [True, True, False]])
    assert masked_greedy(vals, mask).argmax(1).tolist() == [1, 1]
    p = masked_softmax(vals, mask, temperature=0.5)
    assert (p[~mask] == 0).all() and np.allclose(p.sum(1), 1)


def test_feature_spec_and_action_mismatch_say_what_differs(tmp_path, catalogue):
    rng, spec = np.random.default_rng(1), FeatureSpec()
    save_checkpoint(tmp_path / "ck", _meta(catalogue, spec), [_net(rng, spec, len(catalogue.actions))])
    with pytest.raises(CheckpointError, match=r"max_count: 8 != 4"):
        load_policy(tmp_path / "ck", FeatureSpec(max_count=4), catalogue.actions)
    other = FeatureSpec(numeric=("task_complexity_score", "step"))
    with pytest.raises(CheckpointError, match=r"feature spec numeric"):
        load_policy(tmp_path / "ck", other)
    with pytest.raises(CheckpointError, match=r"unknown to the data: \['llama-3.1-8b'\]"):
        load_policy(tmp_path / "ck", spec, catalogue.actions[:-1])
    with pytest.raises(CheckpointError, match=r"missing in checkpoint: \['new-model'\]"):
        load_policy(tmp_path / "ck", spec, (*catalogue.actions, "new-model"))


def test_missing_or_malformed_checkpoints(tmp_path, catalogue):
    with pytest.raises(CheckpointError, match="policy.json not found"):
        load_policy(tmp_path / "nothing")
    ck = tmp_path / "ck"
    spec = FeatureSpec()
    save_checkpoint(ck, _meta(catalogue, spec), [_net(np.random.default_rng(2), spec, len(catalogue.actions))])
    raw = json.loads((ck / "policy.json").read_text())
    (ck / "policy.json").write_text(json.dumps(raw | {"version": 99}))
    with pytest.raises(CheckpointError, match="checkpoint version 99"):
        load_policy(ck)
    (ck / "policy.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_policy(ck)
    with pytest.raises(CheckpointError, match="head must be one of"):
        save_checkpoint(tmp_path / "bad", _meta(catalogue, spec, head="argmax"),
                        [_net(np.random.default_rng(3), spec, 6)])


def _saved(tmp_path, catalogue):
    spec = FeatureSpec()
    return save_checkpoint(tmp_path / "ck", _meta(catalogue, spec),
                           [_net(np.random.default_rng(6), spec, len(catalogue.actions))])


def _npy_bytes(tmp_path) -> bytes:
    np.save(tmp_path / "one.npy", np.zeros(3))
    return (tmp_path / "one.npy").read_bytes()


def _npz_bytes(tmp_path, **arrays) -> bytes:
    np.savez(tmp_path / "other.npz", **arrays)
    return (tmp_path / "other.npz").read_bytes()


@pytest.mark.parametrize("damage", [
    pytest.param(lambda b, tmp: b[: len(b) // 2], id="truncated"),
    pytest.param(lambda b, tmp: b"", id="empty"),
    pytest.param(lambda b, tmp: b"\x00garbage\xff" * 50, id="garbage"),
    pytest.param(lambda b, tmp: b[:40] + bytes(64) + b[104:], id="zeroed-member"),
    pytest.param(lambda b, tmp: _npy_bytes(tmp), id="bare-npy"),
    pytest.param(lambda b, tmp: _npz_bytes(tmp, x=np.zeros(2)), id="foreign-arrays"),
    pytest.param(lambda b, tmp: _npz_bytes(tmp, n0_w0=np.zeros((2, 2))), id="missing-bias"),
])
def test_a_damaged_weights_file_is_an_error_naming_it_and_saying_to_retrain(tmp_path, catalogue, damage):
    wf = _saved(tmp_path, catalogue) / "weights.npz"
    wf.write_bytes(damage(wf.read_bytes(), tmp_path))
    with pytest.raises(CheckpointError) as err:
        load_policy(wf.parent)
    assert str(wf) in str(err.value) and "re-materialize the policy asset" in str(err.value)


@pytest.mark.parametrize("content", [b'{"kind": "bc", "version": 1\xff}', b"\xff\xfe{}", b"[1, 2]", b'"bc"'],
                         ids=["bad-utf8", "bom-utf16", "json-list", "json-string"])
def test_a_damaged_policy_json_is_an_error_naming_it_and_saying_to_retrain(tmp_path, catalogue, content):
    pj = _saved(tmp_path, catalogue) / "policy.json"
    pj.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        load_policy(pj.parent)
    assert str(pj) in str(err.value) and "re-materialize the policy asset" in str(err.value)


def test_save_replaces_atomically_and_leaves_no_temporaries(tmp_path, catalogue):
    rng, spec = np.random.default_rng(4), FeatureSpec()
    for _ in range(2):
        save_checkpoint(tmp_path / "ck", _meta(catalogue, spec), [_net(rng, spec, len(catalogue.actions))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["policy.json", "weights.npz"]


def test_load_policy_imports_no_torch_dagster_or_gx(tmp_path, catalogue):
    """Serving a checkpoint pays for numpy only: not torch, dagster, great_expectations, docker,
    nor pydantic (the configs' models: importing it made `import sage_pipeline.rl` 1.5x as long, +0.1 s at
    load 2 and +0.3 s at load 6 on a shared 2-core host; so FeatureSpec stays a dataclass)."""
    spec = FeatureSpec()
    save_checkpoint(tmp_path / "ck", _meta(catalogue, spec), [_net(np.random.default_rng(5), spec, 6)])
    code = (f"import sys; from sage_pipeline.rl import load_policy; load_policy({str(tmp_path / 'ck')!r}); "
            "bad = [m for m in ('torch', 'dagster', 'great_expectations', 'docker', 'pydantic') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_forward_pass_in_row_blocks_matches_one_pass(monkeypatch):
    """mlp_forward runs FORWARD_ROWS rows at a time so memory stays flat on large logs;
    rows are independent, so the outputs are those of one pass (to float32 rounding)."""
    import sage_pipeline.rl.checkpoint as ck

    rng = np.random.default_rng(0)
    layers = [(rng.normal(size=(16, 7)).astype(np.float32), rng.normal(size=16).astype(np.float32)),
              (rng.normal(size=(5, 16)).astype(np.float32), rng.normal(size=5).astype(np.float32))]
    x = rng.normal(size=(1000, 7))
    whole = ck.mlp_forward(layers, x)
    monkeypatch.setattr(ck, "FORWARD_ROWS", 64)
    blocks = ck.mlp_forward(layers, x)
    assert blocks.shape == whole.shape == (1000, 5) and blocks.dtype == whole.dtype
    np.testing.assert_allclose(blocks, whole, rtol=1e-6, atol=1e-6)
    assert ck.mlp_forward(layers, x[:64]).shape == (64, 5)


def test_bc_cql_and_ppo_results_save_one_way(tmp_path, catalogue):
    """Every trained result saves itself: ``result.save(path, training_data_sha256=None,
    metrics=None)``, through the atomic save_checkpoint; BC and CQL add ``metrics`` to their own."""
    import inspect

    from sage_pipeline.rl import bc, cql, ppo

    params = {cls.__name__: [(p.name, p.default) for p in inspect.signature(cls.save).parameters.values()]
              for cls in (bc.BCResult, cql.CQLResult, ppo.PPOResult)}
    assert len({tuple(v) for v in params.values()}) == 1, params
    assert params["BCResult"] == [("self", inspect.Parameter.empty), ("path", inspect.Parameter.empty),
                                  ("training_data_sha256", None), ("metrics", None)]
    assert not [n for n in (*vars(bc), *vars(cql)) if n.startswith("save_") and n != "save_checkpoint"]

    rng, spec = np.random.default_rng(0), FeatureSpec()
    k, mask = len(catalogue.actions), catalogue.role_mask()
    results = {
        "bc": bc.BCResult(nets=[_net(rng, spec, k)], temperature=1.5, metrics={"holdout_nll_after": 0.9},
                          config=bc.BCConfig(), feature_spec=spec.to_dict(), actions=catalogue.actions,
                          role_mask=mask, training_data_sha256="d" * 64),
        "cql": cql.CQLResult(nets=[_net(rng, spec, k), _net(rng, spec, k)], config=cql.CQLConfig(), spec=spec,
                             actions=catalogue.actions, role_mask=mask, metrics={"td_loss": 0.1}),
    }
    ctx = _ctx(50, rng)
    for kind, res in results.items():
        path = res.save(tmp_path / kind, training_data_sha256="ab" * 32, metrics={"selected_by": "test"})
        pol = load_policy(path, spec, catalogue.actions)
        assert pol.meta.kind == kind and pol.meta.training_data_sha256 == "ab" * 32
        assert pol.meta.metrics == {**res.metrics, "selected_by": "test"}
        np.testing.assert_array_equal(pol.action_probs(ctx), res.policy().action_probs(ctx))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bc", "cql"]  # no temporary left over
