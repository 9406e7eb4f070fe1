"""Policy checkpoints: a folder with ``policy.json`` and ``weights.npz``.

``policy.json`` holds the kind, the checkpoint version, the feature spec, the ordered
actions and their per-role mask, the training data's hash, metrics and the training
config. ``weights.npz`` holds one MLP, or an ensemble of MLPs whose outputs are averaged (the
critics of CQL), as plain arrays, so serving a policy needs numpy only: :func:`load_policy`
imports neither torch, dagster nor great_expectations.

Loading a checkpoint against data whose feature spec or action set differs is an error
that says what differs.

``spec_kind`` names the observation encoding the policy reads: ``"routing"`` (the
routing :class:`~sage_pipeline.routing.features.FeatureSpec` over ``Contexts``; the
default, so checkpoints written before the field existed load unchanged) or
``"code_task"`` (the code-task environment's :class:`~sage_pipeline.sim.obs.ObsSpec`
over ``CodeTaskObs``, written by PPO). A checkpoint checked against a spec of the other
kind is an error naming both kinds.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from sage_pipeline import artifacts
from sage_pipeline.routing.features import Contexts

CHECKPOINT_VERSION = 1
POLICY_FILE = "policy.json"
WEIGHTS_FILE = "weights.npz"
HEADS = ("softmax", "greedy")
_WEIGHT_KEY = re.compile(r"n(\d+)_([wb])(\d+)")  # n<net>_<w|b><layer>, as save_checkpoint names them
# what np.load and reading a member of a damaged .npz raise (TypeError: a bare .npy array, not an archive)
_NPZ_ERRORS = (OSError, ValueError, EOFError, KeyError, TypeError, AttributeError, zipfile.BadZipFile,
               zlib.error)
# spec_kind -> "module:class" of the observation spec (imported only when used)
SPEC_KINDS = {"routing": "sage_pipeline.routing.features:FeatureSpec",
              "code_task": "sage_pipeline.sim.obs:ObsSpec"}


_RETRAIN = "retrain the policy (re-materialize the policy asset that wrote this checkpoint)"


class CheckpointError(ValueError):
    """A checkpoint is missing, malformed, or does not fit the data it is used with."""


@dataclass(frozen=True)
class CheckpointMeta:
    kind: str  # bc, cql, ppo, ...
    feature_spec: dict
    actions: list[str]
    role_mask: list[list[bool]]
    head: str = "softmax"  # softmax over logits / temperature, or greedy argmax of Q-values
    temperature: float = 1.0
    training_data_sha256: str | None = None
    metrics: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    version: int = CHECKPOINT_VERSION
    spec_kind: str = "routing"  # which observation spec feature_spec describes (SPEC_KINDS)
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


FORWARD_ROWS = 32_768  # rows per block of mlp_forward: hidden activations stay a few MB on any data size


def mlp_forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """ReLU MLP forward pass in numpy (weights stored as (out, in) like torch.nn.Linear),
    ``FORWARD_ROWS`` rows at a time (rows are independent)."""
    x = x.astype(np.float32, copy=False)
    if len(x) > FORWARD_ROWS:
        first = mlp_forward(layers, x[:FORWARD_ROWS])
        out = np.empty((len(x), first.shape[1]), dtype=first.dtype)
        out[:FORWARD_ROWS] = first
        for i in range(FORWARD_ROWS, len(x), FORWARD_ROWS):
            out[i:i + FORWARD_ROWS] = mlp_forward(layers, x[i:i + FORWARD_ROWS])
        return out
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h


def masked_softmax(logits: np.ndarray, mask: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.where(mask, logits / temperature, -np.inf)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z) * mask
    return e / e.sum(axis=1, keepdims=True)


def masked_greedy(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    best = np.where(mask, values, -np.inf).argmax(axis=1)
    out = np.zeros(values.shape, dtype=np.float64)
    out[np.arange(len(values)), best] = 1.0
    return out


Layers = list[tuple[np.ndarray, np.ndarray]]  # one MLP: (weight (out, in), bias (out,)) per layer


def spec_kind_of(spec) -> str:
    """The ``spec_kind`` of an observation spec object (FeatureSpec is ``"routing"``)."""
    return getattr(type(spec), "spec_kind", "routing")


def spec_from_meta(meta: CheckpointMeta, source: str = "checkpoint"):
    """The observation spec object a checkpoint's ``feature_spec`` describes."""
    if meta.spec_kind not in SPEC_KINDS:
        raise CheckpointError(f"{source}: unknown spec_kind {meta.spec_kind!r} (known: {', '.join(SPEC_KINDS)}); "
                              "the checkpoint was written by a newer version of this code")
    module, cls = SPEC_KINDS[meta.spec_kind].split(":")
    spec_cls = getattr(importlib.import_module(module), cls)
    try:
        return spec_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta.feature_spec.items()})
    except TypeError as exc:
        raise CheckpointError(f"{source}: feature_spec does not describe a {meta.spec_kind!r} spec ({exc})") from exc


@dataclass(frozen=True)
class MLPPolicy:
    """A trained policy served from its checkpoint: encode -> MLP(s) -> masked head."""

    meta: CheckpointMeta
    nets: list[Layers]  # outputs are averaged over the ensemble
    name: str = "mlp"

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.meta.actions)

    @property
    def role_mask(self) -> np.ndarray:
        return np.asarray(self.meta.role_mask, dtype=bool)

    @property
    def spec(self):
        """The observation spec (a FeatureSpec for routing checkpoints, an ObsSpec for code-task ones)."""
        return spec_from_meta(self.meta, self.name)

    def check_compatible(self, spec=None, actions: tuple[str, ...] | None = None) -> None:
        """Raise :class:`CheckpointError` saying what differs if this checkpoint was trained on another
        observation spec or action set (callers below ``rl`` use it without importing ``rl``)."""
        check_compatible(self.meta, self.name, spec, actions)

    def outputs(self, ctx: Contexts) -> np.ndarray:
        """Raw network outputs (logits or Q-values), (n, K)."""
        x = self.spec.encode(ctx)
        return np.mean([mlp_forward(layers, x) for layers in self.nets], axis=0).astype(np.float64)

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        mask = self.role_mask[ctx.role]
        out = self.outputs(ctx)
        if self.meta.head == "greedy":
            return masked_greedy(out, mask)
        return masked_softmax(out, mask, self.meta.temperature)


def save_checkpoint(path: str | Path, meta: CheckpointMeta, nets: list[Layers]) -> Path:
    """Write the checkpoint folder atomically: built in a temporary sibling, then renamed.

    ``nets`` is a list of MLPs (one for BC; several critics for CQL, averaged at serving).
    """
    if meta.head not in HEADS:
        raise CheckpointError(f"head must be one of {HEADS}, got {meta.head!r}")
    if not nets or not all(nets):
        raise CheckpointError("a checkpoint needs at least one network with at least one layer")
    path = Path(path)
    arrays = {f"n{j}_{kind}{i}": arr for j, layers in enumerate(nets)
              for i, (w, b) in enumerate(layers) for kind, arr in (("w", w), ("b", b))}
    with artifacts.atomic_dir(path) as tmp:
        with artifacts.atomic_open(tmp / WEIGHTS_FILE, "wb") as fh:
            np.savez(fh, **arrays)
        artifacts.write_json(tmp / POLICY_FILE, asdict(meta) | {"n_nets": len(nets)})
    return path


_READ_ATTEMPTS = 10  # each retry means a newer save of the folder was swapped in meanwhile


def _read_checkpoint(path: Path, read):
    """``read(dir_fd)`` on one open folder, so every file comes from the same saved version.

    A save swaps a new folder in and deletes the old one's files (artifacts.atomic_dir), so a
    reader still holding the old folder can find a file gone: when the path now names another
    folder, read again from that one."""
    for attempt in range(_READ_ATTEMPTS):
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointError(f"{path} is not a policy checkpoint: {POLICY_FILE} not found "
                                  "(materialize the policy asset that writes it first)") from None
        try:
            return read(dir_fd)
        except CheckpointError:
            if attempt == _READ_ATTEMPTS - 1 or not artifacts.folder_replaced(path, dir_fd):
                raise
        finally:
            os.close(dir_fd)
    raise AssertionError("unreachable")


def _read_meta_at(path: Path, dir_fd: int) -> CheckpointMeta:
    pj = path / POLICY_FILE
    data = artifacts.read_at(dir_fd, POLICY_FILE)
    if data is None:
        raise CheckpointError(f"{path} is not a policy checkpoint: {POLICY_FILE} not found "
                              "(materialize the policy asset that writes it first)")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{pj}: not valid JSON ({exc}); the checkpoint is damaged: {_RETRAIN}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{pj}: holds a JSON {type(raw).__name__}, not an object; the checkpoint is "
                              f"damaged: {_RETRAIN}")
    if raw.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{pj}: checkpoint version {raw.get('version')!r}, this code reads "
                              f"version {CHECKPOINT_VERSION}; retrain the policy")
    raw.pop("n_nets", None)
    try:
        return CheckpointMeta(**raw)
    except TypeError as exc:
        raise CheckpointError(f"{pj}: unexpected or missing fields ({exc})") from exc


def read_meta(path: str | Path) -> CheckpointMeta:
    path = Path(path)
    return _read_checkpoint(path, lambda dir_fd: _read_meta_at(path, dir_fd))


def check_compatible(meta: CheckpointMeta, source: str, spec=None,
                     actions: tuple[str, ...] | None = None) -> None:
    """Raise if the checkpoint was trained on another observation spec (kind or content)
    or action set. ``spec`` is a FeatureSpec (routing) or an ObsSpec (code task)."""
    problems = []
    if spec is not None and spec_kind_of(spec) != meta.spec_kind:
        problems.append(f"observation spec kind differs: checkpoint reads {meta.spec_kind!r} observations, "
                        f"the data is {spec_kind_of(spec)!r}")
    elif spec is not None:
        mine = spec_from_meta(meta, source)
        problems += [f"feature spec {d}" for d in mine.diff(spec)]
    if actions is not None and tuple(meta.actions) != tuple(actions):
        missing = [a for a in actions if a not in meta.actions]
        extra = [a for a in meta.actions if a not in actions]
        problems.append(f"actions differ: checkpoint has {meta.actions}, data has {list(actions)} "
                        f"(missing in checkpoint: {missing}, unknown to the data: {extra})")
    if problems:
        raise CheckpointError(f"checkpoint {source} does not match the data: " + "; ".join(problems)
                              + ". Retrain the policy on this data or use the matching catalogue.")


def load_policy(path: str | Path, spec=None,
                actions: tuple[str, ...] | None = None) -> MLPPolicy:
    """Load a checkpoint folder as a policy (numpy only). With ``spec``/``actions``, check
    that the checkpoint fits them and say what differs if not."""
    path = Path(path)

    def read(dir_fd: int) -> MLPPolicy:  # both files from the same folder, whatever saves do meanwhile
        meta = _read_meta_at(path, dir_fd)
        check_compatible(meta, str(path), spec, actions)
        wf = path / WEIGHTS_FILE
        data = artifacts.read_at(dir_fd, WEIGHTS_FILE)
        if data is None:
            raise CheckpointError(f"{path}: {WEIGHTS_FILE} not found; {_RETRAIN}")
        return MLPPolicy(meta, _read_weights(io.BytesIO(data), wf), name=meta.kind)

    return _read_checkpoint(path, read)


def _layer_counts(wf: Path, keys: list[str]) -> list[int]:
    """Layers per net from the array names; raise unless they are n0..nN, each with w0/b0..wL/bL."""
    found: dict[int, set[tuple[str, int]]] = {}
    for k in keys:
        m = _WEIGHT_KEY.fullmatch(k)
        if m is None:
            raise CheckpointError(f"{wf}: array {k!r} is not a layer of a policy network (n<net>_w<layer> / "
                                  f"n<net>_b<layer>); {_RETRAIN}")
        found.setdefault(int(m[1]), set()).add((m[2], int(m[3])))
    if not found:
        raise CheckpointError(f"{wf}: holds no network; {_RETRAIN}")
    counts = [len(found.get(j, ())) // 2 for j in range(max(found) + 1)]
    for j, n in enumerate(counts):
        if not n or found[j] != {(kind, i) for i in range(n) for kind in "wb"}:
            raise CheckpointError(f"{wf}: network n{j} has an incomplete set of layers "
                                  f"({sorted(found.get(j, ()))}); {_RETRAIN}")
    return counts


def _read_weights(source, wf: Path) -> list[Layers]:
    """The networks in an open ``weights.npz`` (``wf`` names it in errors); a damaged or foreign
    file is an error naming it."""
    try:
        with np.load(source) as z:
            counts = _layer_counts(wf, list(z.files))
            return [[(z[f"n{j}_w{i}"], z[f"n{j}_b{i}"]) for i in range(n)] for j, n in enumerate(counts)]
    except CheckpointError:
        raise
    except _NPZ_ERRORS as exc:
        raise CheckpointError(f"{wf}: not a readable weights archive, it is damaged or truncated "
                              f"({type(exc).__name__}: {exc}); {_RETRAIN}") from exc
