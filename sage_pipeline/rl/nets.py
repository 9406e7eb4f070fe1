"""The networks the learners build, in one place: ReLU MLPs in torch, batched ensembles of them,
and their export to the numpy layers a checkpoint holds.

Exported layers are ``(weight (out, in), bias (out,))`` float32 arrays, the layout of
``torch.nn.Linear`` and of :func:`sage_pipeline.rl.checkpoint.mlp_forward`, which serves them
with numpy only.

* :func:`mlp`: one ``nn.Sequential`` (BC's policy; with :func:`orthogonal_init`, CleanRL's
  PPO actor and critic);
* :class:`Ensemble`: M independent MLPs of one shape evaluated as one batched matmul chain
  (CQL's critics over alphas, the routing benchmark's grid routers over cost weights), its
  members started from :func:`linear_init`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from sage_pipeline.rl.checkpoint import Layers

Init = Callable[[nn.Linear, bool], None]  # (layer, is_output_layer) -> re-initialise it in place


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, init: Init | None = None) -> nn.Sequential:
    """``Linear(in, h1), ReLU, ..., Linear(h_last, out)``; no hidden layer is a linear map.

    Without ``init`` the layers keep ``nn.Linear``'s default initialisation. With it, each
    layer is re-initialised right after it is built, so random draws come in the same order
    as building and initialising one layer at a time."""
    dims = (int(in_dim), *map(int, hidden))
    if min(*dims, int(out_dim)) < 1:
        raise ValueError(f"an MLP needs input, hidden and output widths >= 1, got {in_dim}, {tuple(hidden)}, "
                         f"{out_dim}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise((*dims, int(out_dim)))):
        layer = nn.Linear(a, b)
        if init is not None:
            init(layer, i == len(dims) - 1)
        layers += [layer, nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no ReLU after the output layer


def orthogonal_init(out_std: float, hidden_std: float = math.sqrt(2), bias: float = 0.0) -> Init:
    """CleanRL's ``layer_init``: orthogonal weights with gain ``hidden_std`` (``out_std`` on the
    output layer) and a constant bias."""

    def init(layer: nn.Linear, is_output: bool) -> None:
        nn.init.orthogonal_(layer.weight, out_std if is_output else hidden_std)
        nn.init.constant_(layer.bias, bias)

    return init


def export_layers(net: nn.Sequential) -> Layers:
    """The ``nn.Linear`` layers of ``net`` as float32 numpy ``(weight (out, in), bias)`` pairs."""
    as_np = lambda t: t.detach().cpu().numpy().astype(np.float32).copy()  # noqa: E731
    return [(as_np(m.weight), as_np(m.bias)) for m in net if isinstance(m, nn.Linear)]


def linear_init(sizes: Sequence[int], seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``nn.Linear``'s default initialisation (uniform in +-1/sqrt(fan_in), weight then bias, layer
    by layer) drawn from a generator of its own seeded with ``seed``, so a member starts the same
    whatever else is trained beside it. Weights are (in, out), as :class:`Ensemble` takes them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        bound = 1.0 / math.sqrt(fan_in)
        out.append(((torch.rand(fan_in, fan_out, generator=g) * 2 - 1) * bound,
                    (torch.rand(fan_out, generator=g) * 2 - 1) * bound))
    return out


class Ensemble(nn.Module):
    """M independent ReLU MLPs evaluated as one batched matmul chain: x (B, in) -> (M, B, out)."""

    def __init__(self, inits: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
        super().__init__()  # inits[m][layer] = (weight (in, out), bias (out,))
        if not inits or not inits[0]:
            raise ValueError("an Ensemble needs at least one member with at least one layer")
        shapes = [[(tuple(w.shape), tuple(b.shape)) for w, b in m] for m in inits]
        for j, s in enumerate(shapes):
            if s != shapes[0]:
                raise ValueError(f"Ensemble member {j} has layers {s}, member 0 {shapes[0]}: every member needs "
                                 "the same shape (build them with linear_init on the same sizes)")
        self.w = nn.ParameterList([torch.stack([m[i][0] for m in inits]) for i in range(len(inits[0]))])
        self.b = nn.ParameterList([torch.stack([m[i][1] for m in inits])[:, None, :]
                                   for i in range(len(inits[0]))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.expand(self.w[0].shape[0], *x.shape)
        for i, (w, b) in enumerate(zip(self.w, self.b)):
            h = torch.baddbmm(b, h, w)
            if i < len(self.w) - 1:
                h = torch.relu(h)
        return h

    def export(self, members: Sequence[int], scale: Sequence[float] | None = None,
               shift: Sequence[float] | None = None) -> list[Layers]:
        """The ``members`` as numpy layers, one list per member. With ``scale`` and ``shift`` (one
        value per entry of ``members``) the last layer is folded into ``out * scale + shift``: how
        a critic trained on normalised rewards serves values in reward units."""
        ws = [w.detach().numpy().astype(np.float32) for w in self.w]
        bs = [b.detach().numpy()[:, 0, :].astype(np.float32) for b in self.b]
        nets = []
        for j, m in enumerate(members):
            layers = [(ws[i][m].T.copy(), bs[i][m].copy()) for i in range(len(ws))]
            if scale is not None:
                w_last, b_last = layers[-1]
                layers[-1] = ((w_last * scale[j]).astype(np.float32),
                              (b_last * scale[j] + shift[j]).astype(np.float32))
            nets.append(layers)
        return nets
