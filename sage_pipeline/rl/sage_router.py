"""What SAGE's router runs: per-role classifiers behind a confidence floor, YAML below it.

SAGE's router hook (a fixed fact of SAGE's source): with ``SAGE_RL_POLICY=1`` it loads
``SAGE_RL_CHECKPOINT`` with ``joblib.load``, a dict ``{"models": {role: classifier},
"feature_keys": [...]}``, calls ``clf.predict_proba([[task_complexity_score, failure_count]])``
and reads ``clf.classes_`` (class 1 = use the fallback). It acts only when
``abs(p - 0.5) * 2 >= SAGE_RL_MIN_CONFIDENCE`` (default 0.55), else, and on any exception,
it keeps the YAML choice; roles without a classifier keep the YAML choice.

So the served policy is a composite, and :class:`ServedSagePolicy` is that composite under
the project's policy contract, which OPE, the simulator's ground truth and the gate judge.
:func:`distill` fits the classifiers to a trained ``sage_binary`` policy's decisions;
:func:`write_sage_checkpoint` writes the file SAGE loads (the dict above, nothing more) and
a JSON manifest with everything else. numpy, scikit-learn and joblib only.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

import joblib
import numpy as np
import sklearn
from sklearn.tree import DecisionTreeClassifier

from sage_pipeline import artifacts

# The inputs SAGE's hook passes, in its own names. Its "failure_count" is the router's count
# of the primary's failures: the dataset's (and MODEL_ROUTING_DECISION's) primary_failure_count.
FEATURE_KEYS = ("task_complexity_score", "failure_count")
CONTEXT_FIELDS = ("task_complexity_score", "primary_failure_count")
JOBLIB_NAME, MANIFEST_NAME = "policy.joblib", "manifest.json"
FORMAT = "sage_router_joblib"
SAGE_DEFAULT_MIN_CONFIDENCE = 0.55
# manifest keys a copy of the checkpoint (sage_router_checkpoint) carries over from its source
CARRIED_MANIFEST_KEYS = ("policy", "source", "reason", "min_confidence_selected_by", "agreement_eval",
                         "dataset_sha256", "summary", "gain_over_table")


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


@dataclass(frozen=True, eq=False)
class ServedSagePolicy:
    """SAGE's router as a policy: classifier when confident, else the YAML table."""

    table: object  # RoutingTable
    space: object  # ActionSpace (the sage_binary mask is used)
    models: dict[str, DecisionTreeClassifier]
    min_confidence: float = SAGE_DEFAULT_MIN_CONFIDENCE
    name: str = "sage_served"
    agreement: dict[str, float] = field(default_factory=dict)  # from distill (manifest facts)
    rows: dict[str, int] = field(default_factory=dict)

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
        return cls(table, space, dict(d.models), min_confidence, name, dict(d.agreement), dict(d.rows))

    def with_min_confidence(self, c: float) -> "ServedSagePolicy":
        return replace(self, min_confidence=float(c))

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.space.actions)

    @property
    def role_mask(self) -> np.ndarray:
        return self.space.binary().mask

    def choose(self, ctx) -> np.ndarray:
        """The column each row is routed to, vectorised per role."""
        out = self.table.choose(self.space, ctx.role, ctx.task_complexity_score, ctx.primary_failure_count,
                                ctx.failure_count)
        x = sage_inputs(ctx)
        for role, clf in self.models.items():
            i = self.space.role_index[role]
            sel = np.flatnonzero(ctx.role == i)
            if not len(sel):
                continue
            p = _p_fallback(clf, x[sel])
            act = np.abs(p - 0.5) * 2.0 >= self.min_confidence
            out[sel[act]] = np.where(p[act] >= 0.5, self.space.fallback[i], self.space.primary[i])
        return out

    def action_probs(self, ctx) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        out[np.arange(len(ctx)), self.choose(ctx)] = 1.0
        return out

    def decide(self, role: str, task_complexity_score: float, failure_count: int, yaml_choice: str) -> str:
        """One decision exactly as SAGE's hook makes it (the test reference)."""
        clf = self.models.get(role)
        if clf is None:
            return yaml_choice
        try:
            p = float(clf.predict_proba([[task_complexity_score, failure_count]])[0][list(clf.classes_).index(1)])
        except Exception:  # noqa: BLE001 - SAGE keeps the YAML choice on any exception
            return yaml_choice
        if abs(p - 0.5) * 2 < self.min_confidence:
            return yaml_choice
        route = self.table.routes[role]
        return route.fallback if p >= 0.5 else route.primary


def to_sage_dict(served: ServedSagePolicy) -> dict:
    """Exactly what SAGE's hook reads, nothing more."""
    return {"models": dict(served.models), "feature_keys": list(FEATURE_KEYS)}


def write_sage_checkpoint(directory: str | Path, served: ServedSagePolicy, manifest: dict,
                          served_at: str | Path | None = None) -> tuple[Path, Path]:
    """``policy.joblib`` (:func:`to_sage_dict`) and ``manifest.json`` (every other fact,
    ``manifest``'s keys included; the computed keys win over a caller's key of the same name),
    written as one: the folder is filled beside ``directory`` and swapped in
    (``artifacts.atomic_dir``), so a killed write never leaves a file the manifest does not
    describe. ``served_at`` is the folder SAGE will be pointed at when that is not where it is
    written (a staged version of an ``artifacts.atomic_set``); links in it are kept, not
    resolved, so the path stays valid after the next switch."""
    directory = Path(directory)
    path = directory / JOBLIB_NAME
    public = Path(os.path.abspath(Path(served_at or directory) / JOBLIB_NAME))
    routes = {r: [served.table.routes[r].primary, served.table.routes[r].fallback] for r in served.models}
    with artifacts.atomic_dir(directory) as tmp:
        with artifacts.atomic_open(tmp / JOBLIB_NAME, "wb") as fh:
            joblib.dump(to_sage_dict(served), fh)
        full = {**manifest, "format": FORMAT, "feature_keys": list(FEATURE_KEYS),
                "inputs_from": list(CONTEXT_FIELDS), "min_confidence": served.min_confidence,
                "roles": sorted(served.models), "routes": routes, "agreement": served.agreement,
                "rows": served.rows, "table": str(getattr(served.table, "source", "")),
                "versions": {"python": platform.python_version(), "numpy": np.__version__,
                             "scikit-learn": sklearn.__version__, "joblib": joblib.__version__},
                "sha256": artifacts.file_sha256(tmp / JOBLIB_NAME),
                "sage_env": {"SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(public),
                             "SAGE_RL_MIN_CONFIDENCE": str(float(served.min_confidence))}}
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
                            dict(manifest.get("rows", {})))


def check_loads_as_sage(path: str | Path, served: ServedSagePolicy, space, n: int = 21) -> int:
    """Load ``path`` as SAGE does and compare its decisions with ``served`` on a grid of states
    for every role; raises on any difference, returns the number of decisions checked."""
    obj = joblib.load(path)
    check = replace(served, models=obj["models"])
    checked = 0
    for role in served.models:
        for c in np.linspace(0.0, 1.0, n):
            for fc in range(4):
                route = served.table.routes[role]
                i = space.role_index[role]
                yaml_choice = route.fallback if served.table.fallback_fires(
                    np.array([i]), np.array([c]), np.array([fc]), np.array([fc]))[0] else route.primary
                a, b = check.decide(role, float(c), fc, yaml_choice), served.decide(role, float(c), fc, yaml_choice)
                if a != b:
                    raise ValueError(f"{path}: role {role!r} at ({c:.2f}, {fc}) decides {a}, the composite {b}")
                checked += 1
    return checked

