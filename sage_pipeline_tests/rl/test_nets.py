"""rl.nets: the MLP builder, its export to numpy, the batched ensemble and its initialisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from sage_pipeline.rl import nets
from sage_pipeline.rl.checkpoint import mlp_forward

SQRT2 = math.sqrt(2)


def test_mlp_is_the_relu_stack_bc_built_with_the_same_draws():
    torch.manual_seed(7)
    net = nets.mlp(5, (16, 8), 3)
    torch.manual_seed(7)  # the stack rl/bc.py built before rl.nets (nn.Linear's default init, in order)
    ref = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    assert [type(m) for m in net] == [type(m) for m in ref]
    for a, b in zip(net.state_dict().values(), ref.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    linear = nets.mlp(4, (), 2)  # no hidden layer: one linear map
    assert [type(m) for m in linear] == [nn.Linear]


def test_orthogonal_init_is_cleanrls_layer_init_with_the_same_draws():
    torch.manual_seed(3)
    net = nets.mlp(6, (32, 32), 4, init=nets.orthogonal_init(out_std=0.01))
    torch.manual_seed(3)  # CleanRL's recipe, as rl/ppo.py writes it: build a layer, then initialise it

    def layer_init(layer, std=SQRT2):
        nn.init.orthogonal_(layer.weight, std)
        nn.init.constant_(layer.bias, 0.0)
        return layer

    ref = nn.Sequential(layer_init(nn.Linear(6, 32)), nn.ReLU(), layer_init(nn.Linear(32, 32)), nn.ReLU(),
                        layer_init(nn.Linear(32, 4), std=0.01))
    for a, b in zip(net.state_dict().values(), ref.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    w = net[0].weight.detach()
    assert torch.allclose(w.T @ w, 2.0 * torch.eye(6), atol=1e-5)  # orthonormal columns times gain sqrt(2)
    assert float(net[-1].bias.detach().abs().max()) == 0.0


def test_exported_layers_serve_the_same_outputs_in_numpy():
    torch.manual_seed(0)
    net = nets.mlp(7, (12,), 5)
    x = np.random.default_rng(1).normal(size=(40, 7)).astype(np.float32)
    layers = nets.export_layers(net)
    assert [(w.shape, b.shape, w.dtype) for w, b in layers] == [((12, 7), (12,), np.float32),
                                                               ((5, 12), (5,), np.float32)]
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(mlp_forward(layers, x), expected, atol=1e-6)


def test_linear_init_is_seeded_bounded_and_per_member():
    a, b = nets.linear_init([10, 4, 3], seed=5), nets.linear_init([10, 4, 3], seed=5)
    assert all(torch.equal(x, y) for (wa, ba), (wb, bb) in zip(a, b) for x, y in ((wa, wb), (ba, bb)))
    assert not torch.equal(a[0][0], nets.linear_init([10, 4, 3], seed=6)[0][0])
    assert [tuple(w.shape) for w, _ in a] == [(10, 4), (4, 3)]  # (in, out), as Ensemble takes them
    for (w, bias), fan_in in zip(a, (10, 4)):
        assert float(w.abs().max()) <= 1 / math.sqrt(fan_in) and float(bias.abs().max()) <= 1 / math.sqrt(fan_in)


def test_ensemble_members_are_independent_mlps_and_export_with_their_affine():
    sizes = [6, 9, 4]
    ens = nets.Ensemble([nets.linear_init(sizes, s) for s in (0, 1, 2)])
    x = np.random.default_rng(2).normal(size=(30, 6)).astype(np.float32)
    with torch.no_grad():
        out = ens(torch.from_numpy(x)).numpy()  # (M, B, out)
    assert out.shape == (3, 30, 4)
    plain = ens.export(range(3))
    for m in range(3):
        np.testing.assert_allclose(mlp_forward(plain[m], x), out[m], atol=1e-5)
    scaled = ens.export([2, 0], scale=[2.0, 0.5], shift=[1.0, -3.0])
    np.testing.assert_allclose(mlp_forward(scaled[0], x), out[2] * 2.0 + 1.0, atol=1e-5)
    np.testing.assert_allclose(mlp_forward(scaled[1], x), out[0] * 0.5 - 3.0, atol=1e-5)


def test_bad_shapes_are_errors_that_say_what_is_wrong():
    with pytest.raises(ValueError, match="widths >= 1"):
        nets.mlp(0, (8,), 2)
    with pytest.raises(ValueError, match="widths >= 1"):
        nets.mlp(3, (8, 0), 2)
    with pytest.raises(ValueError, match="at least one member"):
        nets.Ensemble([])
    with pytest.raises(ValueError, match="member 1 has layers"):
        nets.Ensemble([nets.linear_init([4, 3], 0), nets.linear_init([5, 3], 1)])
