"""Exploration SAGE's unchanged router executes, and the exact probability of every decision it logs.

SAGE's router is a deterministic function of (task_complexity_score, failure count), so its
logs support no other decision. An **exploring checkpoint** makes it randomise between each
role's primary and fallback with a known probability, using only what SAGE's
``load_routing_policy`` already loads: per role a stock soft ``VotingClassifier`` (weights
4, 2, 1) of

* ``target``: a region classifier (``sage_router.region_classifier``) whose P(fallback) x is
  1/4 where the target policy takes the primary and 1/2 where it takes the fallback (0 and 1
  where the role does not explore);
* ``keep`` and ``flip``: ``DummyClassifier(strategy="stratified")``, which draw one-hot class
  rows from numpy's global RNG at every ``predict_proba`` call (``random_state=None``), class 1
  with probability q_keep = 1 - rate and q_flip = rate / (1 - rate).

So SAGE's p_fallback = (4x + 2K + F) / 7 with K ~ Bernoulli(q_keep), F ~ Bernoulli(q_flip), a
multiple of 1/7 that is never 1/2: every value has confidence |2p - 1| >= 1/7, and SAGE acts at
any floor in (0, 1/7] (the manifest recommends :data:`EXPLORE_FLOOR`; a floor > 0 also keeps
YAML for a role without a classifier). P(fallback) is q_keep = 1 - rate where the target
falls back (x = 1/2: fallback iff K = 1) and q_keep * q_flip = rate where it takes the primary
(x = 1/4: fallback iff K = F = 1), 1 and 0 where the role does not explore; any rate in
[0, 1/2] is reached, to double precision.

**Cost of exploring.** Against its deterministic target the exploring policy loses
``V(target) - V(exploring)``; for one decision that is ``rate * E[Q(x, target(x)) -
Q(x, other(x))]``, the mean advantage of the target's choice over the other model (in
episodes the simulator's backward induction gives it exactly: :func:`exploration_cost`).

**Reconstruction.** :func:`decision_probability` gives the exact probability SAGE had of
choosing a logged ``MODEL_ROUTING_DECISION``'s selected model from the line and the checkpoint
deployed then (identified by its sha256 in the deployments record, :func:`record_deployment`,
with the floor SAGE ran it at): it enumerates every draw of every stratified dummy in the
checkpoint, computes p as ``VotingClassifier.predict_proba`` does, and applies SAGE's floor and
YAML. :func:`reconstruct_propensities` does it for a frame of routing decisions.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import joblib
import numpy as np
import pandas as pd

from sage_pipeline import artifacts
from sage_pipeline.sage import checkpoint as sr
from sage_pipeline.sage.table import RoleRoute, Trigger

DEFAULT_RATE = 0.1  # the exploration rate: P(the model the target does not choose), per explored decision
MAX_RATE = 0.5
TARGET_WEIGHT, KEEP_WEIGHT, FLIP_WEIGHT = 4, 2, 1
MIN_EXPLORING_CONFIDENCE = 1.0 / (TARGET_WEIGHT + KEEP_WEIGHT + FLIP_WEIGHT)  # 1/7: every p's |2p - 1| is >= it
EXPLORE_FLOOR = 0.1  # SAGE_RL_MIN_CONFIDENCE the manifest recommends: in (0, 1/7]
# the target region classifier's leaf value -> what the role does there
LEAF_PRIMARY, LEAF_FALLBACK, LEAF_NEVER, LEAF_ALWAYS = 0.25, 0.5, 0.0, 1.0
DEPLOYMENTS_FILE = ("checkpoints", "sage_deployments.jsonl")
DEPLOYED_DIR = ("checkpoints", "sage_deployed")  # content-addressed copies: <sha256>/policy.joblib
YAML = "yaml"


@dataclass(frozen=True)
class ExploreConfig:
    """How the exploring checkpoint explores around its deterministic target."""

    rate: float = DEFAULT_RATE  # P(the other model) in every explored context, in [0, 0.5]
    roles: tuple[str, ...] | None = None  # roles that explore (None: every role with two models)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and 0.0 <= self.rate <= MAX_RATE):
            raise ValueError(f"exploration rate {self.rate!r}: use a number in [0, {MAX_RATE}] (the probability of "
                             "the model the target policy does not choose)")


# ------------------------------------------------------------------ the target policy's decisions
def _target(target, table):
    """(fallback(role, s, f) -> bool, edges(role), anchors(role)) of a deterministic served policy:
    a RoutingTable (SAGE's YAML) or a sage_router.ServedSagePolicy (deterministic classifiers)."""
    if isinstance(target, sr.ServedSagePolicy):
        def fallback(role, s, f):
            return target.decide(role, s, f) == target.table.routes[role].fallback

        def edges(role):
            (e, a), clf = sr.yaml_edges(table.routes[role]), target.models.get(role)
            if clf is not None:
                ce = sr.classifier_edges(clf)
                e = (e[0] + ce[0], e[1] + ce[1])
            return e, a
        return fallback, edges
    return (lambda role, s, f: bool(sr.yaml_fallback(table.routes[role], s, f)[0])), \
        (lambda role: sr.yaml_edges(table.routes[role]))


def _stratified(q: float):
    """A DummyClassifier(strategy="stratified") whose predict_proba row is class 1 with
    probability ``q`` (numpy's global RNG, fresh at every call)."""
    from sklearn.dummy import DummyClassifier

    return DummyClassifier(strategy="stratified").fit(np.zeros((2, 2)), [0, 1], sample_weight=[1.0 - q, q])


def exploring_classifier(region, rate: float):
    """The stock soft VotingClassifier SAGE loads for one role (see the module doc)."""
    from sklearn.ensemble import VotingClassifier
    from sklearn.frozen import FrozenEstimator

    q_keep = 1.0 - rate
    q_flip = rate / q_keep
    clf = VotingClassifier([("target", FrozenEstimator(region)), ("keep", FrozenEstimator(_stratified(q_keep))),
                            ("flip", FrozenEstimator(_stratified(q_flip)))], voting="soft",
                           weights=[TARGET_WEIGHT, KEEP_WEIGHT, FLIP_WEIGHT])
    return clf.fit(np.zeros((2, 2)), [0, 1])


def draw_probabilities(clf) -> dict[str, float]:
    """The exact class-1 probabilities of an exploring classifier's dummies (what it draws with)."""
    named = {n: getattr(e, "estimator", e) for n, e in clf.estimators}
    return {n: float(named[n].class_prior_[1]) for n in ("keep", "flip")}


@dataclass(frozen=True, eq=False)
class ExploringSagePolicy(sr.SageBinaryPolicy):
    """The exploring checkpoint as a policy (the project's contract: ``action_probs``), exact:
    P(fallback) from the checkpoint's own classifiers, floor and SAGE's YAML."""

    table: object  # RoutingTable
    space: object  # ActionSpace (sage_binary)
    models: dict
    rate: float
    target: str  # what it explores around
    explored: tuple[str, ...]
    min_confidence: float = EXPLORE_FLOOR
    name: str = "sage_exploring"
    agreement: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    yaml_roles: tuple[str, ...] = ()

    def rates(self) -> dict[str, float]:
        """The exact probabilities of the other model, per explored role (equal for all)."""
        out = {}
        for role in self.explored:
            d = draw_probabilities(self.models[role])
            out[role] = d["keep"] * d["flip"]
        return out

    def manifest_facts(self) -> dict:
        rates = self.rates()
        d = draw_probabilities(self.models[self.explored[0]]) if self.explored else {"keep": 1.0, "flip": 0.0}
        return {"kind": sr.KIND_EXPLORING, "exploration": {
            "rate_requested": self.rate, "target": self.target, "explored_roles": list(self.explored),
            "p_other_where_target_is_primary": rates, "p_fallback_where_target_is_fallback": d["keep"],
            "draws": {"keep": d["keep"], "flip": d["flip"]},
            "weights": {"target": TARGET_WEIGHT, "keep": KEEP_WEIGHT, "flip": FLIP_WEIGHT},
            "min_confidence_of_any_draw": MIN_EXPLORING_CONFIDENCE,
            "cost": "V(target) - V(exploring) = rate * mean advantage of the target's choice over the other "
                    "model per decision (sage_explore.exploration_cost gives it where the simulator's truth exists)"}}

    def fallback_probs(self, role: str, task_complexity_score, failure_count) -> np.ndarray:
        """Exact P(SAGE picks the fallback) for each state of ``role``."""
        route = self.table.routes[role]
        x = np.column_stack(np.broadcast_arrays(np.atleast_1d(np.asarray(task_complexity_score, dtype=np.float64)),
                                                np.atleast_1d(np.asarray(failure_count, dtype=np.float64))))
        if route.primary == route.fallback:
            return np.zeros(len(x))
        dist = choice_distribution(self.models.get(role), x, self.min_confidence)
        return dist.p_fallback(sr.yaml_fallback(route, x[:, 0], x[:, 1]))

    def action_probs(self, ctx) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        x = sr.sage_inputs(ctx)
        for i, role in enumerate(self.space.roles):
            sel = np.flatnonzero(ctx.role == i)
            if not len(sel):
                continue
            p = self.fallback_probs(role, x[sel, 0], x[sel, 1])
            out[sel, self.space.primary[i]] += 1.0 - p
            out[sel, self.space.fallback[i]] += p
        return out


def build_exploring(target, space, config: ExploreConfig = ExploreConfig(), table=None) -> ExploringSagePolicy:
    """An exploring checkpoint around ``target``: a RoutingTable (SAGE's YAML; ``table`` defaults
    to it) or a deterministic :class:`sage_router.ServedSagePolicy`. In every context an explored
    role takes the target's model with probability 1 - rate and the other with probability rate
    (exactly, see :meth:`ExploringSagePolicy.rates`); roles not explored keep the target's."""
    table = table or (target.table if isinstance(target, sr.ServedSagePolicy) else target)
    routed = [r for r in space.roles if table.routes[r].primary != table.routes[r].fallback]
    explored = tuple(routed if config.roles is None else [r for r in routed if r in config.roles])
    unknown = sorted(set(config.roles or ()) - set(space.roles))
    if unknown:
        raise ValueError(f"roles {unknown} to explore are not roles of the action space ({', '.join(space.roles)})")
    fallback, edges = _target(target, table)
    models = {}
    for role in routed:
        e, a = edges(role)
        if role in explored and config.rate > 0:
            region = sr.region_classifier(
                e, a, lambda s, f, role=role: LEAF_FALLBACK if fallback(role, s, f) else LEAF_PRIMARY, config.seed)
            models[role] = exploring_classifier(region, float(config.rate))
        else:
            models[role] = sr.region_classifier(
                e, a, lambda s, f, role=role: LEAF_ALWAYS if fallback(role, s, f) else LEAF_NEVER, config.seed)
    name = getattr(target, "name", None) or f"yaml:{table.source}"
    return ExploringSagePolicy(table, space, models, float(config.rate), name,
                               explored if config.rate > 0 else ())


def load_exploring_checkpoint(path: str | Path, table, space) -> ExploringSagePolicy:
    """An exploring checkpoint written by ``sage_router.write_sage_checkpoint``, checked against
    ``table`` as ``load_sage_checkpoint`` checks a deterministic one (hash, routes)."""
    directory = sr._folder(path)
    manifest = sr.read_manifest(directory)
    if manifest.get("kind") != sr.KIND_EXPLORING:
        raise ValueError(f"{directory}: kind {manifest.get('kind', sr.KIND_DETERMINISTIC)!r}, not an exploring "
                         "checkpoint (load it with sage_router.load_sage_checkpoint)")
    obj = _load_verified(directory / sr.JOBLIB_NAME, manifest["sha256"])
    sr.check_table(table, sr.RoutingTable.from_dict({"routing": manifest["sage_table"]["routing"]},
                                                    source=manifest["sage_table"]["path"]))
    ex = manifest["exploration"]
    return ExploringSagePolicy(table, space, dict(obj["models"]), float(ex["rate_requested"]), ex["target"],
                               tuple(ex["explored_roles"]), float(manifest["min_confidence"]))


def check_loads(path: str | Path, policy: ExploringSagePolicy, space, n: int = 21) -> int:
    """Load ``path`` as SAGE does and compare every role's exact P(fallback) with ``policy``'s on a
    grid of states; raises on any difference, returns the number of states checked."""
    loaded = ExploringSagePolicy(policy.table, space, dict(joblib.load(path)["models"]), policy.rate, policy.target,
                                 policy.explored, policy.min_confidence)
    s = np.repeat(np.linspace(0.0, 1.0, n), 5)
    fc = np.tile(np.arange(5), n)
    for role in space.roles:
        a, b = loaded.fallback_probs(role, s, fc), policy.fallback_probs(role, s, fc)
        if not np.array_equal(a, b):
            raise ValueError(f"{path}: role {role!r}: P(fallback) of the file differs from the policy's")
    return len(s) * len(space.roles)


def exploration_cost(sim, target, exploring: ExploringSagePolicy, tasks) -> dict:
    """Ground truth of what exploring costs: the simulator's exact values of the target and the
    exploring policy on ``tasks`` (``sim``: a routing_simulator.RoutingSimulator)."""
    v_t, v_e = sim.policy_value(target, tasks).mean, sim.policy_value(exploring, tasks).mean
    return {"rate": exploring.rate, "value_target": v_t, "value_exploring": v_e, "value_lost": v_t - v_e,
            "value_lost_per_unit_rate": (v_t - v_e) / exploring.rate if exploring.rate else 0.0}


# ------------------------------------------------------------------ exact choice probabilities
def outcomes(clf, x: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """Every ``predict_proba(x)`` the classifier can return, with its probability: a stratified
    DummyClassifier draws a one-hot row (class c with probability class_prior_[c]); a soft
    VotingClassifier averages its estimators' outcomes as its predict_proba does; anything else
    is deterministic."""
    from sklearn.dummy import DummyClassifier
    from sklearn.ensemble import VotingClassifier

    inner = getattr(clf, "estimator", None)
    if type(clf).__name__ == "FrozenEstimator" and inner is not None:
        return outcomes(inner, x)
    if isinstance(clf, DummyClassifier) and getattr(clf, "_strategy", clf.strategy) == "stratified":
        prior = np.asarray(clf.class_prior_, dtype=np.float64)
        return [(float(q), np.tile(np.eye(len(prior))[c], (len(x), 1))) for c, q in enumerate(prior) if q > 0]
    if isinstance(clf, VotingClassifier) and clf.voting == "soft":
        out = []
        for combo in itertools.product(*(outcomes(e, x) for e in clf.estimators_)):
            prob = math.prod(c[0] for c in combo)
            out.append((prob, np.average(np.asarray([c[1] for c in combo]), axis=0, weights=clf._weights_not_none)))
        return out
    return [(1.0, np.asarray(clf.predict_proba(x), dtype=np.float64))]


@dataclass(frozen=True)
class ChoiceDistribution:
    """Per state: P(SAGE's learned branch picks the fallback), P(it picks the primary), P(SAGE
    keeps its YAML choice: policy_source yaml)."""

    learned_fallback: np.ndarray
    learned_primary: np.ndarray
    yaml: np.ndarray

    def p_fallback(self, yaml_fallback: np.ndarray) -> np.ndarray:
        return self.learned_fallback + self.yaml * np.asarray(yaml_fallback, dtype=np.float64)


def choice_distribution(clf, x: np.ndarray, min_confidence: float) -> ChoiceDistribution:
    """SAGE's ``ModelRouter.select`` with ``clf`` for the role at floor ``min_confidence``, over every
    draw: p_fb as RoutingPolicy reads it (class 1's column), confidence ``min(1, |p - 0.5| * 2)``,
    acting when it is >= the floor. No classifier: p 0 at confidence 0."""
    n = len(x)
    lf, lp, y = np.zeros(n), np.zeros(n), np.zeros(n)
    if clf is None:  # SAGE: (p 0, confidence 0), not a confidence computed from p
        act = np.full(n, 0.0 >= min_confidence)
        return ChoiceDistribution(np.zeros(n), act.astype(np.float64), (~act).astype(np.float64))
    col = list(getattr(clf, "classes_", [0, 1]))
    pairs = [(q, proba[:, col.index(1)] if 1 in col else proba[:, -1]) for q, proba in outcomes(clf, x)]
    for q, p in pairs:
        act = np.minimum(1.0, np.abs(p - 0.5) * 2.0) >= min_confidence
        lf += q * (act & (p >= 0.5))
        lp += q * (act & (p < 0.5))
        y += q * ~act
    return ChoiceDistribution(lf, lp, y)


# ------------------------------------------------------------------ deployments
class DeploymentRecordError(ValueError):
    """A bad line of the deployments record: file, line, field, what to do."""

    def __init__(self, path, line: int, field_name: str, message: str) -> None:
        super().__init__(f"{path}:{line}: field {field_name!r}: {message}")
        self.path, self.line, self.field = str(path), line, field_name


@dataclass(frozen=True)
class Deployment:
    """One window in which SAGE ran a checkpoint (sha256 None: no checkpoint, its YAML only)."""

    sha256: str | None
    path: str | None  # the archived policy.joblib (content-addressed, never rewritten)
    min_confidence: float | None  # SAGE_RL_MIN_CONFIDENCE SAGE ran it with
    deployed_from: datetime
    deployed_until: datetime | None  # None: open (until the next record starts)
    line: int = 0

    def covers(self, ts: datetime) -> bool:
        return self.deployed_from <= ts and (self.deployed_until is None or ts < self.deployed_until)

    def to_dict(self) -> dict:
        return {"sha256": self.sha256, "path": self.path, "min_confidence": self.min_confidence,
                "deployed_from": _iso(self.deployed_from),
                "deployed_until": _iso(self.deployed_until) if self.deployed_until else None}


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat()


def _utc(value, path=None, line=0, name="timestamp") -> datetime:
    if isinstance(value, datetime):
        ts = value
    else:
        try:
            ts = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as exc:
            raise DeploymentRecordError(path, line, name, f"{value!r} is not an ISO 8601 time: write e.g. "
                                        "2026-11-27T12:00:00+00:00") from exc
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


def deployments_path(root: str | Path) -> Path:
    return Path(root).joinpath(*DEPLOYMENTS_FILE)


def read_deployments(path: str | Path) -> list[Deployment]:
    """The record, validated: each line a JSON object with sha256 (64 hex or null), path,
    min_confidence (a number >= 0, or null with sha256 null), deployed_from, deployed_until (ISO
    8601 or null); windows in time order, none overlapping. A missing file is an empty record."""
    path = Path(path)
    return _parse_deployments(path.read_text(encoding="utf-8"), path) if path.is_file() else []


def _parse_deployments(text: str, path) -> list[Deployment]:
    out: list[Deployment] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DeploymentRecordError(path, n, "<line>", f"not JSON ({exc.msg}): one object per line") from exc
        if not isinstance(rec, dict):
            raise DeploymentRecordError(path, n, "<line>", "not a JSON object")
        for key in ("sha256", "deployed_from"):
            if key not in rec:
                raise DeploymentRecordError(path, n, key, "missing (record deployments with record_deployment)")
        sha = rec["sha256"]
        if sha is not None and not (isinstance(sha, str) and len(sha) == 64
                                    and all(c in "0123456789abcdef" for c in sha)):
            raise DeploymentRecordError(path, n, "sha256", f"{sha!r}: 64 lowercase hex digits, or null for YAML only")
        if sha is not None and not isinstance(rec.get("path"), str):
            raise DeploymentRecordError(path, n, "path", "the deployed policy.joblib's path is missing")
        floor = rec.get("min_confidence")
        if sha is not None and not (isinstance(floor, (int, float)) and not isinstance(floor, bool)
                                    and math.isfinite(floor) and floor >= 0):
            raise DeploymentRecordError(path, n, "min_confidence", f"{floor!r}: the SAGE_RL_MIN_CONFIDENCE SAGE ran "
                                        "with, a number >= 0")
        start = _utc(rec["deployed_from"], path, n, "deployed_from")
        end = None if rec.get("deployed_until") is None else _utc(rec["deployed_until"], path, n, "deployed_until")
        if end is not None and end <= start:
            raise DeploymentRecordError(path, n, "deployed_until", f"{_iso(end)} is not after deployed_from")
        if out and start < out[-1].deployed_from:
            raise DeploymentRecordError(path, n, "deployed_from", f"{_iso(start)} is before the previous line's "
                                        f"{_iso(out[-1].deployed_from)}: keep the record in time order")
        if out and out[-1].deployed_until is not None and start < out[-1].deployed_until:
            raise DeploymentRecordError(path, n, "deployed_from", f"{_iso(start)} overlaps the previous window "
                                        f"(until {_iso(out[-1].deployed_until)})")
        out.append(Deployment(sha, rec.get("path"), None if floor is None else float(floor), start, end, n))
    return out


def deployment_at(deployments: list[Deployment], ts) -> Deployment | None:
    """The deployment SAGE ran at ``ts``: the last window started at or before it that is not
    closed by then (its own deployed_until, or the next record's start); None: none recorded."""
    ts = _utc(ts)
    found = None
    for d in deployments:
        if d.deployed_from <= ts:
            found = d
        else:
            break
    return found if found is not None and found.covers(ts) else None


def record_deployment(root: str | Path, checkpoint: str | Path | None, deployed_from=None,
                      min_confidence: float | None = None, deployed_until=None) -> Deployment:
    """Append a deployment to ``<root>/checkpoints/sage_deployments.jsonl`` (``checkpoint``: the
    folder or policy.joblib SAGE_RL_CHECKPOINT names; None: SAGE runs its YAML only from then on).
    The checkpoint is copied to ``checkpoints/sage_deployed/<sha256>/`` (its path is what is
    recorded: the folder SAGE loads is rewritten by the next checkpoint); ``min_confidence``
    defaults to the manifest's. The whole record is rewritten atomically."""
    root = Path(root)
    start = _utc(deployed_from or datetime.now(timezone.utc))
    previous = read_deployments(deployments_path(root))
    if previous and (start < previous[-1].deployed_from
                     or (previous[-1].deployed_until is not None and start < previous[-1].deployed_until)):
        raise DeploymentRecordError(deployments_path(root), previous[-1].line + 1, "deployed_from",
                                    f"{_iso(start)} is before the end of the last window (line {previous[-1].line}): "
                                    "deployments are recorded in time order and never overlap")
    sha = path = None
    if checkpoint is not None:
        folder = sr._folder(checkpoint)
        manifest = sr.read_manifest(folder)
        sha = artifacts.file_sha256(folder / sr.JOBLIB_NAME)
        if sha != manifest.get("sha256"):
            raise ValueError(f"{folder / sr.JOBLIB_NAME}: sha256 differs from its manifest: rewrite the checkpoint")
        home = root.joinpath(*DEPLOYED_DIR, sha)
        if not (home / sr.JOBLIB_NAME).is_file():
            with artifacts.atomic_dir(home) as tmp:
                for name in (sr.JOBLIB_NAME, sr.MANIFEST_NAME):
                    shutil.copyfile(folder / name, tmp / name)
        path = str(home / sr.JOBLIB_NAME)
        min_confidence = float(manifest["min_confidence"] if min_confidence is None else min_confidence)
    dep = Deployment(sha, path, min_confidence, start, None if deployed_until is None else _utc(deployed_until))
    file = deployments_path(root)
    old = file.read_text(encoding="utf-8") if file.is_file() else ""
    text = old + ("" if not old or old.endswith("\n") else "\n") + json.dumps(dep.to_dict()) + "\n"
    records = _parse_deployments(text, file)  # the new line must keep the record valid: refused before writing
    file.parent.mkdir(parents=True, exist_ok=True)
    artifacts.write_text(file, text)
    return records[-1]


@dataclass(frozen=True)
class DeployedCheckpoint:
    sha256: str
    models: dict
    manifest: dict
    min_confidence: float


def _load_verified(path: Path, sha256: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the deployed checkpoint must stay where the record says")
    got = artifacts.file_sha256(path)
    if got != sha256:
        raise ValueError(f"{path}: sha256 {got} is not the recorded {sha256}: the file changed after deployment")
    return joblib.load(path)


def load_deployed(dep: Deployment) -> DeployedCheckpoint:
    """The checkpoint a deployment ran, verified by its sha256, with its manifest beside it."""
    obj = _load_verified(Path(dep.path), dep.sha256)
    manifest_path = Path(dep.path).parent / sr.MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    return DeployedCheckpoint(dep.sha256, dict(obj["models"]), manifest, float(dep.min_confidence))


# ------------------------------------------------------------------ one decision's probability
@dataclass(frozen=True)
class Propensity:
    probability: float  # NaN when it cannot be known (see note)
    provenance: str  # 'yaml' or the deployed checkpoint's sha256
    note: str = ""


def _route_of(ck: DeployedCheckpoint, role: str, primary: str, fallback: str) -> RoleRoute | None:
    routing = (ck.manifest.get("sage_table") or {}).get("routing") or {}
    spec = routing.get(role)
    if spec is None:
        return None
    triggers = tuple(Trigger.parse(t, source="manifest", role=role, i=i) for i, t in
                     enumerate(spec.get("fallback_triggers", [])))
    return RoleRoute(role, spec["primary"], spec["fallback"], triggers)


def _matched(value) -> int:
    """How many triggers a line says fired (a list, an array from parquet, a JSON string, or None)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 0
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return len(value)


def _yaml_fallback_of(d: Mapping, route: RoleRoute | None) -> bool:
    if route is not None:
        return bool(sr.yaml_fallback(route, d["task_complexity_score"], d["primary_failure_count"])[0])
    return _matched(d.get("matched_fallback_triggers")) > 0


def decision_probability(decision: Mapping, checkpoint: DeployedCheckpoint | None) -> Propensity:
    """The exact probability SAGE's router had of choosing ``decision['selected_model']``, given the
    parsed MODEL_ROUTING_DECISION (agent_role, task_complexity_score, primary_failure_count,
    primary_model, fallback_model, selected_model, policy_source, matched_fallback_triggers) and the
    checkpoint deployed then (None: SAGE ran its YAML only). NaN, with the reason, when the line
    cannot have come from that router (e.g. a 'learned' line with no checkpoint deployed)."""
    d = decision
    role, sel, src = d["agent_role"], d["selected_model"], d.get("policy_source")
    primary, fallback = d["primary_model"], d["fallback_model"]
    prov = YAML if checkpoint is None else checkpoint.sha256
    if sel not in (primary, fallback):
        return Propensity(math.nan, prov, f"selected model {sel!r} is neither the primary nor the fallback")
    if src not in (YAML, "learned"):
        return Propensity(math.nan, prov, f"policy_source {src!r}: SAGE logs 'yaml' or 'learned'")
    if checkpoint is None:
        if src == "learned":
            return Propensity(math.nan, YAML, "a learned decision while no checkpoint is recorded as deployed: "
                              "record the deployment (sage_explore.record_deployment)")
        return Propensity(1.0, YAML)
    clf = checkpoint.models.get(role)
    routes = dict(checkpoint.manifest.get("routes") or {})
    route = _route_of(checkpoint, role, primary, fallback)
    if route is not None:
        routes.setdefault(role, [route.primary, route.fallback])
    if role in routes and list(routes[role]) != [primary, fallback]:
        return Propensity(math.nan, prov, f"the checkpoint was written for {role} primary/fallback "
                          f"{routes[role][0]}/{routes[role][1]}, the line routes {primary}/{fallback}: SAGE ran "
                          "another table than the checkpoint's")
    x = np.array([[float(d["task_complexity_score"]), float(d["primary_failure_count"])]])
    dist = choice_distribution(clf, x, checkpoint.min_confidence)
    yfb = _yaml_fallback_of(d, route)
    if src == YAML and sel != (fallback if yfb else primary):
        return Propensity(math.nan, prov, "a yaml decision that is not the YAML choice of the checkpoint's table")
    p_src = dist.yaml[0] if src == YAML else dist.learned_fallback[0] + dist.learned_primary[0]
    if p_src <= 0:
        return Propensity(math.nan, prov, f"policy_source {src!r} is impossible here with checkpoint "
                          f"{checkpoint.sha256[:12]} at floor {checkpoint.min_confidence} (was it loaded?)")
    if primary == fallback:
        return Propensity(1.0, prov)
    p_fb = float(dist.p_fallback(np.array([yfb]))[0])
    return Propensity(p_fb if sel == fallback else 1.0 - p_fb, prov)


def reconstruct_propensities(decisions, deployments: list[Deployment] | str | Path,
                             loader=load_deployed):
    """For a frame of routing decisions (sage_pipeline.routing.schema.ROUTING_DECISION_COLUMNS),
    a frame on the same index: ``propensity`` (exact P(selected_model), NaN when unknown),
    ``propensity_checkpoint`` ('yaml' or the deployed checkpoint's sha256) and
    ``propensity_note`` (why NaN, else empty). ``deployments``: the record or its file."""
    deps = read_deployments(deployments) if isinstance(deployments, (str, Path)) else list(deployments)
    loaded: dict[str, DeployedCheckpoint] = {}
    out = pd.DataFrame({"propensity": np.nan, "propensity_checkpoint": YAML, "propensity_note": ""},
                       index=decisions.index)
    ts = pd.to_datetime(decisions["timestamp_utc"], utc=True)
    which = [deployment_at(deps, t) if not pd.isna(t) else None for t in ts]
    groups: dict = {}
    for pos, dep in enumerate(which):
        groups.setdefault(None if dep is None or dep.sha256 is None else dep, []).append(pos)
    cols = [c for c in ("agent_role", "task_complexity_score", "primary_failure_count", "primary_model",
                        "fallback_model", "selected_model", "policy_source", "matched_fallback_triggers")
            if c in decisions.columns]
    records = decisions[cols].to_dict("records")
    for dep, positions in groups.items():
        ck = None
        if dep is not None:
            key = f"{dep.sha256}@{dep.min_confidence}"
            try:
                ck = loaded[key] = loaded.get(key) or loader(dep)
            except (OSError, ValueError, KeyError) as exc:  # one unreadable checkpoint: its decisions unknown, said
                out.iloc[positions, 0] = np.nan
                out.iloc[positions, 1] = dep.sha256
                out.iloc[positions, 2] = (f"the checkpoint deployed then ({dep.path}) cannot be read: {exc}; "
                                          "restore it, or record what SAGE ran (python -m "
                                          "sage_pipeline.sage.explore deploy)")
                continue
        cache: dict = {}
        for pos in positions:
            r = records[pos]
            missing = [c for c in ("task_complexity_score", "primary_failure_count") if pd.isna(r.get(c))]
            if missing:  # SAGE's router always writes both (model_router.py): a line without them is not SAGE's
                out.iat[pos, 0], out.iat[pos, 1] = np.nan, None
                out.iat[pos, 2] = (f"the MODEL_ROUTING_DECISION line has no {' or '.join(missing)}, which SAGE's "
                                   "router always writes: what it decided cannot be reconstructed")
                continue
            key = (r["agent_role"], float(r["task_complexity_score"]), int(r["primary_failure_count"]),
                   r["primary_model"], r["fallback_model"], r["selected_model"], r.get("policy_source"),
                   _matched(r.get("matched_fallback_triggers")) > 0)
            res = cache.get(key)
            if res is None:
                res = cache[key] = decision_probability(r, ck)
            out.iat[pos, 0], out.iat[pos, 1], out.iat[pos, 2] = res.probability, res.provenance, res.note
    bad_ts = ts.isna().to_numpy() & bool(deps)  # with no deployment ever recorded, every line is YAML's
    out.loc[bad_ts, "propensity_note"] = "no timestamp: the deployment then is unknown"
    out.loc[bad_ts, "propensity"] = np.nan
    return out


NOT_YAML_ONLY = ("the logs hold 'learned' decisions at times no deployed checkpoint is recorded for, so SAGE's "
                 "router was not running its YAML table alone then: record what it ran (python -m "
                 "sage_pipeline.sage.explore deploy ...)")


def unexplained_learned(routing_decisions: pd.DataFrame, deployments: list[Deployment]) -> int:
    """How many 'learned' MODEL_ROUTING_DECISIONs fall where the record says SAGE ran its YAML only
    (no record, or a ``--yaml`` window): each one refutes that a YAML line there had probability 1."""
    learned = routing_decisions.loc[routing_decisions["policy_source"] == "learned", "timestamp_utc"]
    count = 0
    for t in pd.to_datetime(learned, utc=True):
        dep = None if pd.isna(t) else deployment_at(deployments, t)
        count += dep is None or dep.sha256 is None
    return count


def propensity_reconstructor(deployments: str | Path, routing_decisions: str | Path | None = None):
    """``frame -> reconstruct_propensities(frame, record)`` for the routing dataset's
    ``propensity_of``, the record read once (a missing file: SAGE ran its YAML only). With
    ``routing_decisions`` (the ingest's side table, every MODEL_ROUTING_DECISION of the logs): when
    a 'learned' line falls where the record says YAML only, no YAML line is given probability 1
    (:data:`NOT_YAML_ONLY`), whichever chunk of the logs it is in."""
    record = read_deployments(deployments)
    cache: dict[str, DeployedCheckpoint] = {}
    refuted = 0
    if routing_decisions is not None and Path(routing_decisions).is_file():
        import pyarrow.parquet as pq

        refuted = unexplained_learned(pq.read_table(routing_decisions, columns=["policy_source", "timestamp_utc"])
                                      .to_pandas(), record)

    def load(dep: Deployment) -> DeployedCheckpoint:
        if dep.sha256 not in cache:
            cache[dep.sha256] = load_deployed(dep)
        return cache[dep.sha256]

    def reconstruct(frame: pd.DataFrame) -> pd.DataFrame:
        out = reconstruct_propensities(frame, record, loader=load)
        if refuted:
            void = out["propensity"].notna() & (out["propensity_checkpoint"] == YAML)
            out.loc[void, "propensity"] = np.nan
            out.loc[void, "propensity_note"] = NOT_YAML_ONLY
        return out

    return reconstruct


def main(argv: list[str] | None = None) -> int:
    """``python -m sage_pipeline.sage.explore deploy CHECKPOINT|--yaml``: record what SAGE runs
    from now (or ``--from``) on, and print the environment that makes SAGE run exactly that."""
    import argparse
    import os

    ap = argparse.ArgumentParser(prog="python -m sage_pipeline.sage.explore",
                                 description="Record which checkpoint SAGE's router runs, so every decision it "
                                             "logs gets its exact probability back (the routing dataset reads "
                                             "<data-dir>/checkpoints/sage_deployments.jsonl).")
    sub = ap.add_subparsers(dest="command", required=True)
    dep = sub.add_parser("deploy", help="SAGE runs CHECKPOINT (or its YAML only, --yaml) from --from on")
    what = dep.add_mutually_exclusive_group(required=True)
    what.add_argument("checkpoint", nargs="?", help="the checkpoint folder or its policy.joblib "
                      "(e.g. datasets/checkpoints/sage)")
    what.add_argument("--yaml", action="store_true", help="SAGE runs without a checkpoint (SAGE_RL_POLICY unset)")
    dep.add_argument("--data-dir", default=os.environ.get("SAGE_DATA_DIR", "datasets"),
                     help="the artifact root (default: SAGE_DATA_DIR, else ./datasets)")
    dep.add_argument("--from", dest="deployed_from", default=None, help="ISO 8601 start (default: now)")
    dep.add_argument("--min-confidence", type=float, default=None,
                     help="the SAGE_RL_MIN_CONFIDENCE SAGE runs it at (default: the manifest's)")
    sub.add_parser("show", help="print the record").add_argument(
        "--data-dir", default=os.environ.get("SAGE_DATA_DIR", "datasets"))
    args = ap.parse_args(argv)
    try:
        if args.command == "show":
            for d in read_deployments(deployments_path(args.data_dir)):
                print(json.dumps(d.to_dict()))
            return 0
        d = record_deployment(args.data_dir, None if args.yaml else args.checkpoint, args.deployed_from,
                              args.min_confidence)
    except (DeploymentRecordError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"recorded in {deployments_path(args.data_dir)}: {json.dumps(d.to_dict())}")
    if d.sha256 is None:
        print("SAGE runs its YAML table: unset SAGE_RL_POLICY")
    else:  # the content-addressed copy: the folder the asset writes is replaced by the next checkpoint
        print(f"export SAGE_RL_POLICY=1\nexport SAGE_RL_CHECKPOINT={os.path.abspath(d.path)}\n"
              f"export SAGE_RL_MIN_CONFIDENCE={d.min_confidence}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
