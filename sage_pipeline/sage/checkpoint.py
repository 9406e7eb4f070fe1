"""What SAGE's router runs: per-role classifiers behind a confidence floor, YAML below it.

SAGE's router hook (a fixed fact of SAGE's source, ``sage/rl/policy.py`` and
``sage/orchestrator/model_router.py``): with ``SAGE_RL_POLICY=1`` it loads
``SAGE_RL_CHECKPOINT`` with ``joblib.load``, a dict ``{"models": {role: classifier},
"feature_keys": [...]}``, calls ``clf.predict_proba([[task_complexity_score, failure_count]])``
and reads ``clf.classes_`` (class 1 = use the fallback). It acts when
``abs(p - 0.5) * 2 >= SAGE_RL_MIN_CONFIDENCE`` (default 0.55), else it keeps the YAML choice.
A role without a classifier counts as ``p = 0, confidence 0``: it keeps YAML only while the
floor is > 0; at a floor of 0 SAGE sends it to its primary. When ``predict_proba`` raises SAGE
uses ``predict`` at confidence 0.6; when that raises too it keeps YAML.

SAGE's YAML rule (``ModelRouter.should_use_fallback``): the fallback when any trigger fires,
both ``primary_failure_count`` and ``failure_count`` being the one count SAGE is passed (the
logged ``primary_failure_count``); a role without triggers falls back when
``failure_count >= 2 or task_complexity_score > 0.8`` (:func:`yaml_fallback`).

So the served policy is a composite, and :class:`ServedSagePolicy` is that composite under
the project's policy contract, which OPE, the simulator's ground truth and the gate judge.
:func:`distill` fits the classifiers to a trained ``sage_binary`` policy's decisions; every
role with a choice to make that the policy did not see gets a classifier that reproduces
SAGE's YAML rule (:func:`yaml_classifier`), so no floor sends it anywhere else.
:func:`write_sage_checkpoint` writes the file SAGE loads (the dict above, nothing more) and
a JSON manifest with everything else, the routing table it is bound to included (its file's
sha256, the sha256 of its parsed routing section, its roles); writing it for a table SAGE
does not run is an error naming the difference. numpy, scikit-learn and joblib only.

scikit-learn's trees compare ``float32(x) <= threshold``, so no tree alone reproduces
``task_complexity_score > 0.8`` (0.8000000000000002 is 0.8 in float32). :func:`region_classifier`
is a stock Pipeline (``numpy.digitize`` of each input over float64 edges, then a tree over the
cell indices) whose regions are exactly SAGE's triggers' and a tree's own (its float32 rule
turned into float64 edges, :func:`float32_edge`), with an exact P(fallback) per region: the
YAML classifiers here and the exploring checkpoints of ``sage_explore`` are built from it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import pickle
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

import joblib
import numpy as np
import sklearn
from sklearn.tree import DecisionTreeClassifier

from sage_pipeline import artifacts
from sage_pipeline.sage.table import BACKCOMPAT_TRIGGERS, RoutingTable, Trigger

# The inputs SAGE's hook passes, in its own names. Its "failure_count" is the router's count
# of the primary's failures: the dataset's (and MODEL_ROUTING_DECISION's) primary_failure_count.
FEATURE_KEYS = ("task_complexity_score", "failure_count")
CONTEXT_FIELDS = ("task_complexity_score", "primary_failure_count")
JOBLIB_NAME, MANIFEST_NAME = "policy.joblib", "manifest.json"
FORMAT = "sage_router_joblib"
SAGE_DEFAULT_MIN_CONFIDENCE = 0.55
# The roles whose agents call ModelRouter.select, the only place SAGE consults the checkpoint
# (sage/agents/{planner,architect,reviewer,debugger,test_engineer,documentation}.py, route_model,
# cli/shell_tui.py, cli/shell_intent.py). The coder never does: sage/agents/coder.py asks
# should_use_fallback (YAML only) and its UCB bandit picks the model; memory_optimizer calls no model.
SAGE_HOOK_ROLES = frozenset({"planner", "architect", "reviewer", "debugger", "test_engineer", "documentation",
                             "shell_router", "shell_chat"})
# manifest keys a copy of the checkpoint (sage_router_checkpoint) carries over from its source
CARRIED_MANIFEST_KEYS = ("policy", "source", "reason", "min_confidence_selected_by", "agreement_eval",
                         "dataset_sha256", "summary", "gain_over_table")
KIND_DETERMINISTIC, KIND_EXPLORING = "deterministic", "exploring"
FEATURE_OF = {"task_complexity_score": 0, "primary_failure_count": 1, "failure_count": 1}  # SAGE's input column


@dataclass(frozen=True)
class SageRouterConfig:
    max_depth: int = 6  # of each role's decision tree: SAGE's two inputs need few splits
    min_samples_leaf: int = 20  # leaves average enough decisions to give a real probability
    seed: int = 0
    min_confidence_grid: tuple[float, ...] = (0.0, 0.2, 0.4, 0.55, 0.7, 0.85, 0.95)
    default_min_confidence: float = SAGE_DEFAULT_MIN_CONFIDENCE

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.min_samples_leaf < 1:
            raise ValueError(f"max_depth and min_samples_leaf must be >= 1, got {self.max_depth}, "
                             f"{self.min_samples_leaf}")
        bad = [c for c in (*self.min_confidence_grid, self.default_min_confidence) if not 0.0 <= c <= 1.0]
        if bad or not self.min_confidence_grid:
            raise ValueError(f"min_confidence values must lie in [0, 1] (grid non-empty), got {bad or 'no grid'}")


def sage_inputs(ctx) -> np.ndarray:
    """(n, 2) float64: the row SAGE's hook passes to predict_proba."""
    return np.column_stack([np.asarray(getattr(ctx, f), dtype=np.float64) for f in CONTEXT_FIELDS])


def fallback_labels(policy, ctx, space) -> np.ndarray:
    """1 where ``policy`` puts more mass on the row's fallback than on its primary (a tie
    counts as the primary)."""
    if tuple(policy.actions) != tuple(space.actions):
        raise ValueError(f"policy {getattr(policy, 'name', policy)!r} has actions {tuple(policy.actions)}, the "
                         f"action space {space.source} has {tuple(space.actions)}: distill a policy trained on "
                         "this routing dataset's action space")
    p = np.asarray(policy.action_probs(ctx))
    if p.shape != (len(ctx), len(space.actions)):
        raise ValueError(f"policy {getattr(policy, 'name', policy)!r} returned shape {p.shape}, expected "
                         f"{(len(ctx), len(space.actions))}")
    rows = np.arange(len(ctx))
    return (p[rows, space.fallback[ctx.role]] > p[rows, space.primary[ctx.role]]).astype(np.int64)


def fit_classifier(x: np.ndarray, y: np.ndarray, config: SageRouterConfig) -> DecisionTreeClassifier:
    """A tree whose ``classes_`` is always [0, 1], as SAGE looks class 1 up: when every label is
    the same, the other class is added as one row of weight 0, so its probability is 0."""
    w = np.ones(len(y))
    missing = [c for c in (0, 1) if c not in set(y.tolist())]
    if missing:
        x = np.vstack([x, x[:1]])
        y = np.append(y, missing[0])
        w = np.append(w, 0.0)
    clf = DecisionTreeClassifier(max_depth=config.max_depth, min_samples_leaf=config.min_samples_leaf,
                                 random_state=config.seed)
    clf.fit(x, y, sample_weight=w)
    return clf


@dataclass(frozen=True)
class Distilled:
    models: dict[str, DecisionTreeClassifier]
    agreement: dict[str, float]  # role -> share of its ctx rows where the tree (no floor) decides as the policy
    rows: dict[str, int]  # role -> ctx rows it was fitted on


def distill(policy, ctx, space, config: SageRouterConfig = SageRouterConfig()) -> Distilled:
    """One classifier per role present in ``ctx`` (roles whose primary is their fallback have
    nothing to decide and get none), fitted on :func:`sage_inputs` to ``policy``'s
    primary-or-fallback decisions (``policy``: a sage_binary policy of ``space``'s actions)."""
    bad = np.setdiff1d(np.unique(ctx.role), np.arange(len(space.roles)))
    if len(bad):
        raise ValueError(f"role indices {bad.tolist()} are not roles of the action space {space.source} "
                         f"({len(space.roles)} roles): build the contexts with this space's roles")
    y, x = fallback_labels(policy, ctx, space), sage_inputs(ctx)
    models, agreement, rows = {}, {}, {}
    for i, role in enumerate(space.roles):
        sel = ctx.role == i
        if not sel.any() or space.primary[i] == space.fallback[i]:
            continue
        clf = fit_classifier(x[sel], y[sel], config)
        models[role] = clf
        agreement[role] = float(((_p_fallback(clf, x[sel]) >= 0.5) == y[sel]).mean())
        rows[role] = int(sel.sum())
    return Distilled(models, agreement, rows)


def _p_fallback(clf, x: np.ndarray) -> np.ndarray:
    """P(class 1) as SAGE reads it (the column of class 1 in ``classes_``)."""
    return clf.predict_proba(x)[:, list(clf.classes_).index(1)]


# ------------------------------------------------------------------ SAGE's YAML rule, exactly
def sage_triggers(route) -> tuple[Trigger, ...]:
    """The triggers SAGE evaluates for ``route`` (a RoleRoute): its own, or SAGE's back-compat
    pair when it has none."""
    return tuple(route.triggers) or BACKCOMPAT_TRIGGERS


def yaml_fallback(route, task_complexity_score, failure_count) -> np.ndarray:
    """Vectorised ``ModelRouter.should_use_fallback``: does SAGE's YAML send these states to the
    fallback? ``failure_count`` is the one count SAGE is passed (the logged primary_failure_count),
    which both trigger variables read."""
    tcs = np.atleast_1d(np.asarray(task_complexity_score, dtype=np.float64))
    fc = np.atleast_1d(np.asarray(failure_count, dtype=np.float64))
    values = {"task_complexity_score": tcs, "primary_failure_count": fc, "failure_count": fc}
    out = np.zeros(np.broadcast(tcs, fc).shape, dtype=bool)
    for trig in sage_triggers(route):
        out |= trig.fires(values)
    return out


def yaml_choice(route, task_complexity_score: float, failure_count: int) -> str:
    """The model SAGE's YAML picks for one state."""
    return route.fallback if yaml_fallback(route, task_complexity_score, failure_count)[0] else route.primary


# ------------------------------------------------------------------ classifiers with exact regions
# A region classifier is a stock Pipeline: a ColumnTransformer that maps each SAGE input to the
# index of its cell (``numpy.digitize`` over float64 edges: a value's cell is the number of edges
# <= it) and a decision tree over those indices. Cells, not raw inputs, because scikit-learn's
# trees compare float32(x) with their thresholds: a tree cannot tell 0.8 from 0.8000000000000002,
# which SAGE's ``task_complexity_score > 0.8`` does.
def _up(x: float) -> float:
    return float(np.nextafter(np.float64(x), np.inf))


def trigger_edges(trig: Trigger) -> list[float]:
    """Edges (float64, exact) at which ``trig`` changes: x >= edge is the other side."""
    b = float(trig.value)
    if trig.op in (">", "<="):
        return [_up(b)]
    if trig.op in (">=", "<"):
        return [b]
    return [b, _up(b)]  # == and !=


def float32_edge(t: float) -> float:
    """The float64 edge of a scikit-learn tree's rule ``float32(x) <= t``: the smallest x for
    which it is false."""
    lo = np.float32(t)
    if float(lo) > t:
        lo = np.nextafter(lo, np.float32(-np.inf))
    hi = np.nextafter(lo, np.float32(np.inf))
    m = (float(lo) + float(hi)) / 2.0  # exact in float64; ties round to the even float32
    return m if np.float32(m) == hi else _up(m)


def classifier_edges(clf) -> tuple[list[float], list[float]]:
    """Per SAGE input, the edges where a deterministic classifier of this module (a
    DecisionTreeClassifier, or a region classifier) can change its answer."""
    if isinstance(clf, DecisionTreeClassifier):
        t = clf.tree_
        inner = t.children_left >= 0
        return tuple([float32_edge(float(x)) for x in t.threshold[inner & (t.feature == k)]]  # type: ignore
                     for k in (0, 1))
    steps = dict(getattr(clf, "steps", []))
    if "cells" in steps:
        return tuple(list(tr.kw_args["bins"]) for _, tr, _ in steps["cells"].transformers_[:2])  # type: ignore
    raise TypeError(f"{type(clf).__name__}: the regions of only a decision tree or a region classifier "
                    "(sage_router.region_classifier) are known")


def _cells(edges: list[float], anchors: list[float]) -> tuple[np.ndarray, list[float]]:
    """Sorted distinct edges and one representative per cell (cell i: edges[i-1] <= x < edges[i]):
    an anchor (a trigger's own value) inside it, else its lower edge."""
    e = np.unique(np.asarray(edges, dtype=np.float64))
    reps: list[float] = []
    for i in range(len(e) + 1):
        lo, hi = (e[i - 1] if i else -np.inf), (e[i] if i < len(e) else np.inf)
        inside = sorted(a for a in anchors if lo <= a < hi)
        if inside:
            reps.append(float(inside[0]))
        elif i:
            reps.append(float(lo))
        else:
            reps.append(float(np.nextafter(hi, -np.inf)) if len(e) else 0.0)
    return e, reps


def _digitizer(bins: np.ndarray):
    from sklearn.preprocessing import FunctionTransformer

    return FunctionTransformer(np.digitize, kw_args={"bins": bins})


# leaf value -> (weight of class 0, weight of class 1): exact fractions in the fitted leaf
LEAF_WEIGHTS = {0.0: (1.0, 0.0), 0.25: (3.0, 1.0), 0.5: (1.0, 1.0), 0.75: (1.0, 3.0), 1.0: (0.0, 1.0)}


def region_classifier(edges: tuple[list[float], list[float]], anchors: tuple[list[float], list[float]],
                      leaf_value, seed: int = 0):
    """A stock scikit-learn Pipeline over SAGE's two inputs whose P(class 1) is exactly
    ``leaf_value(score, count)`` (one of :data:`LEAF_WEIGHTS`' keys) in each cell of the grid the
    edges make (per input; x >= edge is the next cell), evaluated at each cell's representative
    (an anchor inside it, else its lower edge). ``classes_`` is [0, 1]."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline

    (es, rs), (ef, rf) = _cells(edges[0], anchors[0]), _cells(edges[1], anchors[1])
    x, y, w, want = [], [], [], []
    for s in rs:
        for f in rf:
            v = float(leaf_value(s, f))
            if v not in LEAF_WEIGHTS:
                raise ValueError(f"leaf value {v} at ({s}, {f}): use one of {sorted(LEAF_WEIGHTS)}")
            want.append(v)
            for label, weight in enumerate(LEAF_WEIGHTS[v]):
                if weight:
                    x.append([s, f]), y.append(label), w.append(weight)
    for label in (0, 1):  # classes_ is always [0, 1], as SAGE looks class 1 up
        if label not in y:
            x.append(x[0]), y.append(label), w.append(0.0)
    cells = ColumnTransformer([("task_complexity_score", _digitizer(es), [0]), ("failure_count", _digitizer(ef), [1])])
    clf = Pipeline([("cells", cells), ("tree", DecisionTreeClassifier(random_state=seed))])
    clf.fit(np.array(x, dtype=np.float64), np.array(y), tree__sample_weight=np.array(w))
    got = clf.predict_proba(np.array([[s, f] for s in rs for f in rf], dtype=np.float64))[:, 1]
    if not np.array_equal(got, np.array(want)):
        raise AssertionError("region_classifier: a cell's P(class 1) differs from the one asked for")
    return clf


def yaml_edges(route) -> tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]:
    """The edges and anchors of SAGE's YAML rule for ``route``, per SAGE input."""
    edges: tuple[list[float], list[float]] = ([], [])
    anchors: tuple[list[float], list[float]] = ([], [])
    for trig in sage_triggers(route):
        edges[FEATURE_OF[trig.var]].extend(trigger_edges(trig))
        anchors[FEATURE_OF[trig.var]].append(float(trig.value))
    return edges, anchors


def yaml_classifier(route, seed: int = 0):
    """A region classifier that reproduces SAGE's YAML rule for ``route`` exactly, at confidence 1
    (P(fallback) 0 or 1), so SAGE routes the role as its YAML does whatever the floor."""
    edges, anchors = yaml_edges(route)
    return region_classifier(edges, anchors, lambda s, f: float(yaml_fallback(route, s, f)[0]), seed)


class SageBinaryPolicy:
    """The policy contract's actions and mask for a policy SAGE's router serves: its ``space``'s
    actions, each role choosing between its primary and fallback only."""

    space: object

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.space.actions)

    @property
    def role_mask(self) -> np.ndarray:
        return self.space.binary().mask


@dataclass(frozen=True, eq=False)
class ServedSagePolicy(SageBinaryPolicy):
    """SAGE's router as a policy: classifier when confident, else SAGE's YAML rule; a role
    without a classifier is sent to its primary at a floor of 0 (SAGE's confidence 0 >= 0),
    else keeps YAML."""

    table: object  # RoutingTable
    space: object  # ActionSpace (the sage_binary mask is used)
    models: dict[str, DecisionTreeClassifier]
    min_confidence: float = SAGE_DEFAULT_MIN_CONFIDENCE
    name: str = "sage_served"
    agreement: dict[str, float] = field(default_factory=dict)  # from distill (manifest facts)
    rows: dict[str, int] = field(default_factory=dict)
    yaml_roles: tuple[str, ...] = ()  # roles whose classifier reproduces SAGE's YAML (the policy saw none)

    def __post_init__(self) -> None:
        if not (isinstance(self.min_confidence, (int, float)) and math.isfinite(self.min_confidence)
                and self.min_confidence >= 0.0):
            raise ValueError(f"min_confidence must be a finite number >= 0 (SAGE compares abs(p - 0.5) * 2 "
                             f"with it), got {self.min_confidence!r}")
        unknown = sorted(set(self.models) - set(self.space.roles))
        if unknown:
            raise ValueError(f"classifiers for roles {unknown} that the action space {self.space.source} does "
                             f"not route (roles: {', '.join(self.space.roles)})")
        for role, clf in self.models.items():
            classes = np.asarray(getattr(clf, "classes_", [])).tolist()
            if classes != [0, 1] or not hasattr(clf, "predict_proba"):
                raise ValueError(f"the classifier of role {role!r} has classes_ {classes}: SAGE's hook needs a "
                                 "fitted classifier with predict_proba and classes_ [0, 1] (1 = fallback)")

    @classmethod
    def from_distilled(cls, d: Distilled, table, space, min_confidence: float = SAGE_DEFAULT_MIN_CONFIDENCE,
                       name: str = "sage_served") -> "ServedSagePolicy":
        """The distilled classifiers, and a YAML classifier for every role with a choice to make
        that the policy did not see (:meth:`with_every_role`)."""
        return cls(table, space, dict(d.models), min_confidence, name, dict(d.agreement),
                   dict(d.rows)).with_every_role()

    def uncovered_roles(self) -> list[str]:
        """Roles with two models to choose from and no classifier: at a floor of 0 SAGE sends them
        to their primary, whatever their YAML says."""
        return [r for r in self.space.roles if r not in self.models
                and self.table.routes[r].primary != self.table.routes[r].fallback]

    def with_every_role(self) -> "ServedSagePolicy":
        """The same decisions at any floor > 0, and at a floor of 0 too: each role in
        :meth:`uncovered_roles` gets :func:`yaml_classifier` (its YAML at confidence 1)."""
        missing = self.uncovered_roles()
        if not missing:
            return self
        return replace(self, models={**self.models, **{r: yaml_classifier(self.table.routes[r]) for r in missing}},
                       yaml_roles=tuple(sorted({*self.yaml_roles, *missing})))

    def with_min_confidence(self, c: float) -> "ServedSagePolicy":
        return replace(self, min_confidence=float(c))

    def choose(self, ctx) -> np.ndarray:
        """The column each row is routed to, vectorised per role, as SAGE routes it: SAGE passes
        the primary failure count, which both trigger variables of its YAML read."""
        out = np.empty(len(ctx), dtype=np.int64)
        x = sage_inputs(ctx)
        for i, role in enumerate(self.space.roles):
            sel = np.flatnonzero(ctx.role == i)
            if not len(sel):
                continue
            primary, fallback = self.space.primary[i], self.space.fallback[i]
            out[sel] = np.where(yaml_fallback(self.table.routes[role], x[sel, 0], x[sel, 1]), fallback, primary)
            clf = self.models.get(role)
            if clf is None:
                if self.min_confidence <= 0.0:  # SAGE: p = 0 at confidence 0, and 0 >= 0
                    out[sel] = primary
                continue
            p = _p_fallback(clf, x[sel])
            act = np.abs(p - 0.5) * 2.0 >= self.min_confidence
            out[sel[act]] = np.where(p[act] >= 0.5, fallback, primary)
        return out

    def action_probs(self, ctx) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        out[np.arange(len(ctx)), self.choose(ctx)] = 1.0
        return out

    def decide(self, role: str, task_complexity_score: float, failure_count: int,
               yaml_model: str | None = None) -> str:
        """One decision exactly as SAGE's ``ModelRouter.select`` makes it with this checkpoint
        (the test reference). ``yaml_model``: the YAML choice, else SAGE's YAML rule on the table."""
        route = self.table.routes[role]
        yaml_model = yaml_model or yaml_choice(route, task_complexity_score, failure_count)
        p_fb, conf = sage_predict(self.models.get(role), task_complexity_score, failure_count)
        if p_fb is None or conf < self.min_confidence:
            return yaml_model
        return route.fallback if p_fb >= 0.5 else route.primary


def sage_predict(clf, task_complexity_score: float, failure_count: int) -> tuple[float | None, float]:
    """``RoutingPolicy.predict_proba_fallback`` of SAGE: (p_fallback, confidence); no classifier
    is (0, 0); ``predict_proba`` raising falls back to ``predict`` at confidence 0.6; ``predict``
    raising too is (None, 0): SAGE logs ROUTING_POLICY_ERROR and keeps YAML."""
    if clf is None:
        return 0.0, 0.0
    x = [[float(task_complexity_score), float(failure_count)]]
    try:
        proba = clf.predict_proba(x)[0]
        classes = list(getattr(clf, "classes_", [0, 1]))
        p_fb = float(proba[classes.index(1)] if 1 in classes else proba[-1])
        return p_fb, min(1.0, abs(p_fb - 0.5) * 2.0)
    except Exception:  # noqa: BLE001 - SAGE's own fallback
        try:
            return (1.0 if int(clf.predict(x)[0]) == 1 else 0.0), 0.6
        except Exception:  # noqa: BLE001
            return None, 0.0


def to_sage_dict(served: ServedSagePolicy) -> dict:
    """Exactly what SAGE's hook reads, nothing more, with each tree's node records canonical
    (:func:`canonical_tree`), so the same classifiers always dump to the same bytes."""
    return {"models": {r: canonical_tree(m) for r, m in served.models.items()}, "feature_keys": list(FEATURE_KEYS)}


def dump_policy(served: ServedSagePolicy, fh) -> None:
    """Write ``policy.joblib``'s bytes to the binary file ``fh``: :func:`to_sage_dict` as a plain pickle
    (protocol 4), which SAGE's ``joblib.load`` reads as it reads joblib's own files.

    Not ``joblib.dump``: it writes a record array through numpy's buffered iterator, which copies
    the fields and leaves the padding between them as the buffer held it, so the same trees gave
    different bytes from one process to the next (a Celery worker's checkpoint and an in-process
    run's of the same step differed). The checkpoint's sha256 is the router candidate's ledger
    key and the bundle's content address: an unchanged policy must give the same bytes. A plain
    pickle writes each array's memory whole, and :func:`canonical_tree` zeroes that padding.

    The pickler's memo is off (``Pickler.fast``): with it, a string met twice is written once if
    both are the same object and twice if they are equal copies, and which it is depends on the
    process's history (an identifier interned in a fitted model, a copy in one read back from a
    pickle): the same trees gave two byte strings (10,315 and 10,295 bytes) in a Celery worker and
    in-process. Without the memo the bytes depend on the values alone (about 3x larger: ~33 kB
    for SAGE's nine roles). A policy holds no cycle (a cyclic one is refused by the pickler)."""
    pickler = pickle.Pickler(fh, protocol=4)
    pickler.fast = True  # no memo: the same values give the same bytes, whatever objects hold them
    pickler.dump(to_sage_dict(served))


def canonical_tree(model):
    """``model`` (a fitted scikit-learn tree) with the padding bytes of its node records zeroed.

    A tree's nodes are C structs with padding between fields that scikit-learn never writes
    (whatever the allocator left there). The fields are copied into a zeroed record array and
    loaded back (``Tree.__setstate__`` copies the records whole); the model is a copy, its
    predictions unchanged. Anything without a ``tree_`` is returned as it is."""
    tree = getattr(model, "tree_", None)
    if tree is None or not hasattr(tree, "__getstate__"):
        return model
    state = tree.__getstate__()
    nodes = state["nodes"]
    clean = np.zeros(nodes.shape, dtype=nodes.dtype)
    for name in nodes.dtype.names:
        clean[name] = nodes[name]
    fresh = type(tree)(tree.n_features, np.asarray(tree.n_classes, dtype=np.intp), tree.n_outputs)
    fresh.__setstate__({**state, "nodes": clean})
    out = copy.copy(model)
    out.tree_ = fresh
    return out


# ------------------------------------------------------------------ the table a checkpoint is bound to
def routing_section(table: RoutingTable) -> dict:
    """The parsed routing section as SAGE routes by it: per role primary, fallback, triggers."""
    return {r: {"primary": table.routes[r].primary, "fallback": table.routes[r].fallback,
                "fallback_triggers": [str(t) for t in table.routes[r].triggers]} for r in table.roles}


def table_digest(table: RoutingTable) -> dict:
    """What names ``table`` in a manifest: its file (absolute path and sha256 of its bytes, when it
    is a file), the sha256 of its parsed routing section (canonical JSON) and its roles."""
    src = Path(str(table.source))
    routing = routing_section(table)
    on_disk = src.is_file()
    return {"path": os.path.abspath(src) if on_disk else str(table.source),
            "sha256": artifacts.file_sha256(src) if on_disk else None,
            "routing_sha256": hashlib.sha256(json.dumps(routing, sort_keys=True).encode()).hexdigest(),
            "roles": list(table.roles), "routing": routing}


def table_differences(trained: RoutingTable, sage: RoutingTable) -> list[str]:
    """How SAGE's table differs from the one a checkpoint was trained for (roles, primary/fallback,
    triggers); empty when SAGE would route by the same rule."""
    out = []
    for role in trained.roles:
        if role not in sage.routes:
            out.append(f"role {role!r} is not in SAGE's table")
            continue
        a, b = trained.routes[role], sage.routes[role]
        if (a.primary, a.fallback) != (b.primary, b.fallback):
            out.append(f"role {role!r}: primary/fallback {a.primary}/{a.fallback} in the checkpoint's table, "
                       f"{b.primary}/{b.fallback} in SAGE's")
        elif [str(t) for t in sage_triggers(a)] != [str(t) for t in sage_triggers(b)]:
            out.append(f"role {role!r}: fallback_triggers {[str(t) for t in a.triggers]} in the checkpoint's table, "
                       f"{[str(t) for t in b.triggers]} in SAGE's")
    out += [f"role {r!r} of SAGE's table is not in the checkpoint's" for r in sage.roles if r not in trained.routes]
    return out


def check_table(trained: RoutingTable, sage: RoutingTable | str | Path) -> RoutingTable:
    """SAGE's table (loaded when a path), refused with what differs and the fix when it is not
    the table the checkpoint was trained for."""
    sage = sage if isinstance(sage, RoutingTable) else RoutingTable.load(sage)
    problems = table_differences(trained, sage)
    if problems:
        raise ValueError(
            f"the checkpoint was trained for the routing table {trained.source}, SAGE runs {sage.source}: "
            + "; ".join(problems) + f". SAGE would route by a table the policy never saw. Fix: build the chain on "
            f"SAGE's table (the sage resource's routing_table, or SAGE_ROUTING_TABLE={sage.source}, then "
            f"routing_dataset onwards), or run SAGE with the checkpoint's table (SAGE_MODELS_YAML={trained.source})")
    return sage


def write_sage_checkpoint(directory: str | Path, served, manifest: dict,
                          served_at: str | Path | None = None,
                          sage_table: RoutingTable | str | Path | None = None) -> tuple[Path, Path]:
    """``policy.joblib`` (:func:`to_sage_dict`) and ``manifest.json`` (every other fact,
    ``manifest``'s keys included; the computed keys win over a caller's key of the same name),
    written as one: the folder is filled beside ``directory`` and swapped in
    (``artifacts.atomic_dir``), so a killed write never leaves a file the manifest does not
    describe. ``served_at`` is the folder SAGE will be pointed at when that is not where it is
    written (a staged version of an ``artifacts.atomic_set``); links in it are kept, not
    resolved, so the path stays valid after the next switch.

    ``served``: a :class:`ServedSagePolicy` or a ``sage_explore.ExploringSagePolicy``. It is
    written only for the table SAGE runs: ``sage_table`` (default: the policy's own table) must
    route as the policy's table does (:func:`check_table`), and the manifest names it
    (:func:`table_digest`; ``sage_env`` pins SAGE to it with ``SAGE_MODELS_YAML`` when it is a
    file). A floor of 0 with a role that has no classifier is refused: SAGE would send that role
    to its primary whatever its YAML says (:meth:`ServedSagePolicy.with_every_role` fixes it)."""
    directory = Path(directory)
    path = directory / JOBLIB_NAME
    public = Path(os.path.abspath(Path(served_at or directory) / JOBLIB_NAME))
    table = check_table(served.table, sage_table) if sage_table is not None else served.table
    uncovered = [r for r in table.roles if r not in served.models
                 and table.routes[r].primary != table.routes[r].fallback]
    if served.min_confidence <= 0.0 and uncovered:
        raise ValueError(f"min_confidence {served.min_confidence}: SAGE gives a role without a classifier confidence "
                         f"0 and, as 0 >= 0, sends it to its primary: roles {uncovered} would leave their YAML. "
                         "Give them their YAML as a classifier (ServedSagePolicy.with_every_role()) or use a floor > 0")
    routes = {r: [served.table.routes[r].primary, served.table.routes[r].fallback] for r in served.models}
    digest = table_digest(table)
    facts = served.manifest_facts() if hasattr(served, "manifest_facts") else {"kind": KIND_DETERMINISTIC}
    env = {"SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(public),
           "SAGE_RL_MIN_CONFIDENCE": str(float(served.min_confidence))}
    if digest["sha256"] is not None:
        env["SAGE_MODELS_YAML"] = digest["path"]
    with artifacts.atomic_dir(directory) as tmp:
        with artifacts.atomic_open(tmp / JOBLIB_NAME, "wb") as fh:
            dump_policy(served, fh)
        full = {**manifest, **facts, "format": FORMAT, "feature_keys": list(FEATURE_KEYS),
                "inputs_from": list(CONTEXT_FIELDS), "min_confidence": served.min_confidence,
                "roles": sorted(served.models), "routes": routes, "agreement": served.agreement,
                "rows": served.rows, "yaml_roles": list(getattr(served, "yaml_roles", ())),
                "table": str(getattr(served.table, "source", "")), "sage_table": digest,
                "versions": {"python": platform.python_version(), "numpy": np.__version__,
                             "scikit-learn": sklearn.__version__, "joblib": joblib.__version__},
                "sha256": artifacts.file_sha256(tmp / JOBLIB_NAME), "sage_env": env,
                "roles_sage_never_consults": sorted(set(served.models) - SAGE_HOOK_ROLES)}
        artifacts.write_json(tmp / MANIFEST_NAME, full)
    return path, directory / MANIFEST_NAME


def _folder(path: str | Path) -> Path:
    """The checkpoint folder, given it or its ``policy.joblib`` (what SAGE_RL_CHECKPOINT names)."""
    path = Path(path)
    return path.parent if path.name == JOBLIB_NAME and not path.is_dir() else path


def read_manifest(directory: str | Path) -> dict:
    p = _folder(directory) / MANIFEST_NAME
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: the folder holds no SAGE router checkpoint "
                                "(write one with write_sage_checkpoint / materialize sage_router_checkpoint)")
    manifest = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{p}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                         f"expected {FORMAT!r}: not a SAGE router checkpoint manifest")
    return manifest


def load_sage_checkpoint(path: str | Path, table, space) -> ServedSagePolicy:
    """The checkpoint (its folder or its ``policy.joblib``) as the composite it serves with
    ``table``; refused, naming the difference, when its roles or their primary/fallback are
    not the table's, or the file is not the one the manifest describes."""
    directory = _folder(path)
    manifest = read_manifest(directory)
    if manifest.get("kind", KIND_DETERMINISTIC) != KIND_DETERMINISTIC:
        raise ValueError(f"{directory}: a {manifest.get('kind')!r} checkpoint draws at random in predict_proba; "
                         "load it with sage_explore.load_exploring_checkpoint")
    path = directory / JOBLIB_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found beside {MANIFEST_NAME}: rewrite the checkpoint")
    if manifest.get("sha256") != artifacts.file_sha256(path):
        raise ValueError(f"{path}: sha256 differs from {MANIFEST_NAME}: the file changed after it was written")
    obj = joblib.load(path)
    if not isinstance(obj, dict) or set(obj) != {"models", "feature_keys"}:
        raise ValueError(f"{path}: not SAGE's router checkpoint (expected a dict with models and feature_keys)")
    if list(obj["feature_keys"]) != list(FEATURE_KEYS):
        raise ValueError(f"{path}: feature_keys {obj['feature_keys']} differ from SAGE's {list(FEATURE_KEYS)}")
    problems = []
    for role, (primary, fallback) in manifest.get("routes", {}).items():
        if role not in table.routes:
            problems.append(f"role {role!r} is not in the table {table.source}")
        elif (table.routes[role].primary, table.routes[role].fallback) != (primary, fallback):
            problems.append(f"role {role!r}: checkpoint trained for primary/fallback {primary}/{fallback}, the "
                            f"table {table.source} has {table.routes[role].primary}/{table.routes[role].fallback}")
    missing = set(obj["models"]) - set(manifest.get("routes", {}))
    if missing:
        problems.append(f"roles {sorted(missing)} have a classifier but no recorded primary/fallback")
    if problems:
        raise ValueError(f"SAGE router checkpoint {path} does not fit the routing table: " + "; ".join(problems)
                         + ". Retrain on logs made with this table, or point SAGE_ROUTING_TABLE at the right one.")
    return ServedSagePolicy(table, space, dict(obj["models"]), float(manifest["min_confidence"]),
                            manifest.get("policy", "sage_served"), dict(manifest.get("agreement", {})),
                            dict(manifest.get("rows", {})), tuple(manifest.get("yaml_roles", ())))


def check_loads_as_sage(path: str | Path, served: ServedSagePolicy, space, n: int = 21) -> int:
    """Load ``path`` as SAGE does and compare its decisions with ``served`` on a grid of states
    for every role of ``space``; raises on any difference, returns the number of decisions checked."""
    obj = joblib.load(path)
    check = replace(served, models=obj["models"])
    checked = 0
    for role in space.roles:
        for c in np.linspace(0.0, 1.0, n):
            for fc in range(4):
                a, b = check.decide(role, float(c), fc), served.decide(role, float(c), fc)
                if a != b:
                    raise ValueError(f"{path}: role {role!r} at ({c:.2f}, {fc}) decides {a}, the composite {b}")
                checked += 1
    return checked
