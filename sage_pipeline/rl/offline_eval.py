"""Offline evaluation: does a learned policy beat the static YAML table, by how much, and
how sure are we?

Every policy is evaluated on the eval split with every OPE estimator (interval, ESS,
support). When the data comes from the routing simulator, each policy is also valued
exactly, so the report puts side by side: the OPE estimate with its interval, the
ground truth, the estimator's relative error and the regret closure
``(V_policy - V_static) / (V_oracle - V_static)``.

The promotion gate reads OPE only, never ground truth: a policy is promoted when the lower
bound of the paired difference of its ``ope.HEADLINE_ESTIMATOR`` (step-wise DR with clipped
trajectory weights, the estimator of the episode value) with the static table's, on the same
report episodes, exceeds :data:`GATE_MIN_GAIN` (0) of the table's estimate (``promotion_gate``).

That per-night rule is valid for **one night only**: run every night on a growing log, each night is a
fresh look at a fresh level, it compares with the table rather than what SAGE runs, and it keeps its last
promotion. SAGE's binary space is therefore gated in one of two modes (``run_sage_binary_eval``'s
``mode``, :data:`GATE_MODES`): ``"ledger"`` (the default) decides through the decision ledger's router
lever (:func:`ledger_gate`, ``sage_pipeline.decisions.router``): each candidate against the *deployed*
policy on the exploring checkpoint's episodes logged after it was proposed, evidence carried across
nights, one error level over every night and candidate, the deployed policy kept on probation and
reverted (to the previous one, or the table) when its advantage is excluded; ``"per_night"`` is the
rule above, kept for one-off comparisons and the benchmarks that measure it.

Any journal set SAGE writes is evaluated, however few its sessions (SAGE without SAGE_SESSION_ID writes
one a day): every interval resamples whole sessions, and below ``OPESettings.min_sessions`` the report
gives estimates without intervals, says how many sessions it has and needs, and the gate refuses with
that sentence. Support is said per role (:func:`logged_support`): the share of logged decisions whose
exact context also saw another model, or whose exploration probability is known; a candidate that
changes decisions where the logs hold no other model is refused in one sentence naming the role, and
BC's propensities estimated from deterministic logs never stand in for exploration.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.decisions import router as ledger_router
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.rl import cql, ope
from sage_pipeline.rl.data import from_dataset
from sage_pipeline.routing import task_outcomes
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.features import Contexts, FeatureSpec
from sage_pipeline.routing.policy import StaticTablePolicy
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.routing.routing_dataset import session_split
from sage_pipeline.sage import checkpoint as sage_router
from sage_pipeline.sage.table import RoutingTable

if TYPE_CHECKING:  # imported where a simulator is built: SAGE's journals never load the routing simulator
    from sage_pipeline.routing.routing_simulator import RoutingSimulator, Tasks

log = logging.getLogger(__name__)

STATIC = "static_table"
GATE_ESTIMATOR = ope.HEADLINE_ESTIMATOR


# ------------------------------------------------------------------ ground truth
def simulator_from_manifest(manifest: str | Path, catalogue: ModelCatalogue, table: RoutingTable,
                            reward: RewardSpec) -> RoutingSimulator:
    """The simulator that generated the logs (its config is in the collector's manifest),
    valuing rewards as the dataset does (``reward``: the dataset's recorded spec)."""
    from sage_pipeline.routing.routing_simulator import RoutingSimulator, SimulatorConfig

    raw = json.loads(Path(manifest).read_text(encoding="utf-8"))["simulator"]
    raw["reward"] = reward
    return RoutingSimulator(catalogue, table, SimulatorConfig(**raw))


def ground_truth_simulator(manifest: str | Path, catalogue: ModelCatalogue, table: RoutingTable,
                           reward: RewardSpec, df_eval: pd.DataFrame,
                           actions: tuple[str, ...]) -> tuple[RoutingSimulator | None, str]:
    """The simulator that knows the true values of the policies judged on ``df_eval``, or None
    and why there is none: every judged decision must come from the synthetic collector (whose
    manifest holds the simulator's config), and the dataset's models (``actions``) must be the
    simulator's; real journals beside the synthetic ones can add models the simulator does not
    know, and the judged half can still hold synthetic sessions only."""
    if not (df_eval["data_source"] == "synthetic").all():
        return None, "not simulated data"
    if not Path(manifest).is_file():
        return None, f"no simulator manifest at {manifest}"
    sim = simulator_from_manifest(manifest, catalogue, table, reward)
    if tuple(sim.actions) != tuple(actions):
        extra = [a for a in actions if a not in sim.actions]
        return None, (f"the dataset's models are not the simulator's (the logs add {extra or 'a different order'}): "
                      "the simulator cannot value policies that choose them")
    return sim, "simulator"


def eval_tasks(data: ope.LoggedData) -> Tasks:
    """The tasks of the logged episodes: their contexts at the first attempt."""
    from sage_pipeline.routing.routing_simulator import Tasks

    first = np.flatnonzero(data.contexts.step == 0)
    c = data.contexts
    return Tasks(c.role[first], c.task_complexity_score[first], c.prompt_tokens[first])


@dataclass(frozen=True)
class GroundTruth:
    episode_value: dict[str, float]  # exact expected episode return, per policy and "oracle"
    first_step_value: dict[str, float]  # exact expected reward of the first decision
    n_tasks: int


def ground_truth(sim: RoutingSimulator, tasks: Tasks, policies: dict[str, object], oracle=None) -> GroundTruth:
    """Exact values of ``policies`` and of ``oracle`` (default: the simulator's optimum over
    every candidate; for the sage_binary space, the optimum restricted to primary/fallback)."""
    ctx0 = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    q0 = np.stack([_expected_or_zero(sim, ctx0, a) for a in range(sim.K)], axis=1)
    episode, first = {}, {}
    for name, pol in {**policies, "oracle": oracle if oracle is not None else sim.oracle_policy()}.items():
        episode[name] = sim.policy_value(pol, tasks).mean
        first[name] = float((pol.action_probs(ctx0) * q0).sum(axis=1).mean())
    return GroundTruth(episode, first, len(tasks))


def _expected_or_zero(sim: RoutingSimulator, ctx, a: int) -> np.ndarray:
    """Exact expected reward of action ``a`` where it is a candidate, 0 elsewhere."""
    ok = sim.role_mask[ctx.role, a]
    out = np.zeros(len(ctx))
    if ok.any():
        idx = np.flatnonzero(ok)
        out[idx] = sim.expected_reward(ctx.take(idx), np.full(len(idx), a))
    return out


def regret_closure(v: float, v_static: float, v_oracle: float) -> float | None:
    gap = v_oracle - v_static
    return None if abs(gap) < 1e-12 else (v - v_static) / gap


# ------------------------------------------------------------------ gate
GATE_RULE = "paired"
# The paired rule's bar, a share of the baseline's estimate: offline_eval's gate promotes any gain
# whose paired lower bound is above 0 (SAGE's binary space, 50 seeds: 50 promotions, none wrong;
# with a bar of 0.5%, 49). A loop that gates every night between near-equal policies needs a bar:
# the simulated month's is policy_iteration.LOOP_MIN_GAIN (docs/benchmarks.md, "Closed loop").
GATE_MIN_GAIN = 0.0


class PromotionGateConfig(BaseModel):
    """The promotion gate's rule (offline_eval's and the simulated month's run configs nest it as
    ``gate``): see :func:`promotion_gate`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["paired", "value"] = Field(GATE_RULE, description="'paired': the lower bound of the candidate's "
                                             "paired gain over the baseline (clipped step-wise DR, the same report "
                                             "episodes, one bootstrap) must exceed min_gain of the baseline's "
                                             "estimate; 'value' (the gate before issue 19): the lower bound of the "
                                             "candidate's own interval must exceed the baseline's estimate")
    min_gain: float = Field(GATE_MIN_GAIN, ge=0.0, description="the paired rule's bar, a share of the baseline's "
                            "estimate (0: any gain whose lower bound is above 0)")


@dataclass(frozen=True)
class GateDecision:
    promoted: str | None
    reason: str
    estimator: str = GATE_ESTIMATOR
    static_estimate: float | None = None
    candidates: dict[str, dict] = field(default_factory=dict)  # name -> {ci_low, difference, passed, why, ...}
    rule: str = GATE_RULE
    min_gain: float = GATE_MIN_GAIN
    mode: str = "per_night"  # or "ledger" (ledger_gate): see the module doc
    ledger: dict = field(default_factory=dict)  # ledger mode: tonight's changes and what SAGE should run now


def promotion_gate(evals: dict[str, ope.PolicyEvaluation], static: str = STATIC,
                   estimator: str = GATE_ESTIMATOR, candidates: tuple[str, ...] | None = None,
                   gate: PromotionGateConfig = PromotionGateConfig(),
                   unsupported: dict[str, str] | None = None) -> GateDecision:
    """Promote the candidate that beats ``static`` (the table, or the deployed policy) by the widest
    margin; else say why none was promoted. One night's test, valid for that night only (the
    ``per_night`` mode; the ``ledger`` mode, :func:`ledger_gate`, holds over nights and candidates).
    ``candidates``: the policies that may be promoted (default: every non-static one; in the
    sage_binary space only the served composites are).

    ``gate.rule="paired"`` (the default): a candidate passes when the lower bound of its paired
    ``estimator`` difference with ``static`` (:func:`ope.paired_difference`: per-episode terms of
    both on the same report episodes, one bootstrap) exceeds ``gate.min_gain`` times the magnitude
    of static's estimate. ``gate.rule="value"`` (the gate before issue 19; ``min_gain`` is ignored):
    when the lower bound of the candidate's own interval exceeds static's point estimate. That
    compares an interval of a value with a number: too strict where the two policies share their
    noise (the candidate's interval carries all of it), too lenient where their terms are
    anti-correlated (where two deterministic policies disagree the logs follow one or the other)
    and blind to static's own error.

    Either rule refuses, saying why in one sentence, a candidate in ``unsupported`` (name -> why:
    it changes decisions where the logs hold no other action, :meth:`LoggedSupport.refusal`) and
    one whose interval was not computed (too few sessions: how many there are and are needed); with
    ``static`` in ``unsupported`` (the baseline is not the logging policy) nothing is promoted."""
    rule, min_gain = gate.rule, gate.min_gain
    unsupported = unsupported or {}
    names = [n for n in evals if n != static and (candidates is None or n in candidates)]
    if static in unsupported or static not in evals or evals[static].estimates[estimator].value is None:
        if static in unsupported:
            reason = f"no promotion: the baseline {static} cannot be valued on these logs: {unsupported[static]}"
        else:
            reason = (f"no promotion: the static table has no {estimator} estimate "
                      f"({evals[static].no_support_reason if static in evals else 'not evaluated'})")
        cands = {n: {"ci_low": None, "passed": False,
                     "why": f"no support: {unsupported[n]}" if n in unsupported else
                     f"the baseline {static} has no {estimator} estimate to compare with"} for n in names}
        return GateDecision(None, reason, estimator, None, cands, rule, min_gain)
    base = evals[static].estimates[estimator].value
    bar = min_gain * abs(base)
    cands = {}
    for name in names:
        ev = evals[name]
        e = ev.estimates[estimator]
        if name in unsupported:
            cands[name] = {"ci_low": None, "passed": False, "why": f"no support: {unsupported[name]}"}
        elif e.value is None:
            why = str(ev.no_support_reason)
            cands[name] = {"ci_low": None, "passed": False,
                           "why": why if why.startswith("no ") else f"no support: {why}"}
        elif e.ci_low is None and rule == "value":
            cands[name] = {"ci_low": None, "estimate": e.value, "passed": False,
                           "why": f"{estimator} {e.value:.4f}, no interval: {ev.interval_reason or 'not computed'}"}
        elif rule == "value":
            passed = e.ci_low > base
            cands[name] = {"ci_low": e.ci_low, "estimate": e.value, "score": e.ci_low, "passed": passed,
                           "why": (f"{estimator} lower bound {e.ci_low:.4f} {'>' if passed else '<='} "
                                   f"{static} estimate {base:.4f}")}
        else:
            d = ope.paired_difference(evals[static], ev, estimator)
            if d.ci_low is None:
                cands[name] = {"ci_low": e.ci_low, "estimate": e.value, "difference": d.value, "passed": False,
                               "why": f"{estimator} paired difference with {static} "
                                      + (f"{d.value:+.4f}, " if d.value is not None else "") + str(d.reason)}
                continue
            passed = d.ci_low > bar
            cands[name] = {"ci_low": e.ci_low, "estimate": e.value, "difference": d.value,
                           "difference_ci_low": d.ci_low, "difference_ci_high": d.ci_high, "score": d.ci_low,
                           "passed": passed,
                           "why": (f"{estimator} paired difference with {static} {d.value:+.4f}, lower bound "
                                   f"{d.ci_low:+.4f} {'>' if passed else '<='} "
                                   + (f"{min_gain:g} x |{static} estimate| = {bar:.4f}" if min_gain else "0"))}
    winners = {n: c for n, c in cands.items() if c["passed"]}
    if not winners:
        detail = "; ".join(f"{n}: {c['why']}" for n, c in cands.items()) or "no candidate policy"
        return GateDecision(None, f"no policy promoted: {detail}", estimator, base, cands, rule, min_gain)
    best = max(winners, key=lambda n: winners[n]["score"])
    return GateDecision(best, f"promoted {best}: {winners[best]['why']}", estimator, base, cands, rule, min_gain)


def promote(decision: GateDecision, checkpoints: dict[str, Path], dest: str | Path,
            evidence: dict) -> Path | None:
    """Copy the promoted checkpoint to ``dest`` atomically, with ``promotion.json``.

    When nothing is promoted, ``dest`` is left as it is (the last promoted policy stays).
    """
    if decision.promoted is None:
        return None
    src = checkpoints.get(decision.promoted)
    if src is None or not Path(src).is_dir():
        raise FileNotFoundError(f"checkpoint of promoted policy {decision.promoted!r} not found at {src}")
    with artifacts.atomic_dir(dest) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        artifacts.write_json(tmp / "promotion.json", {"policy": decision.promoted, "source": str(src),
                                                     "reason": decision.reason, **evidence})
    return Path(dest)


def promote_served(decision: GateDecision, served: dict[str, "ServedSelection"], dest: str | Path,
                   evidence: dict, served_at: str | Path | None = None) -> Path | None:
    """Write the promoted served composite (SAGE's joblib file and its manifest) to ``dest``;
    when nothing is promoted, ``dest`` is left as it is."""
    if decision.promoted is None:
        return None
    if decision.mode == "ledger":
        raise ValueError(f"{decision.promoted} was accepted by the ledger: deploy the checkpoint it names "
                         f"(decision.ledger['deploy']: {decision.ledger.get('deploy')}), kept since it was proposed, "
                         "not one of tonight's served candidates")
    sel = served[decision.promoted]
    c = decision.candidates.get(decision.promoted, {})
    sage_router.write_sage_checkpoint(dest, sel.policy, {
        "policy": decision.promoted, "source": sel.source, "reason": decision.reason,
        # the gate's paired estimate of the gain over the table, with its 95% interval (online_ab reads it)
        "gain_over_table": {k: c.get(k) for k in ("difference", "difference_ci_low", "difference_ci_high")},
        "min_confidence_selected_by": sel.how, "agreement_eval": sel.agreement_eval, **evidence},
        served_at=served_at)
    return Path(dest)


CANDIDATES_DIR = "sage_binary_candidates"  # checkpoints/gate/<this>/<name>/: every served candidate judged


def keep_candidates(served: dict[str, "ServedSelection"], dest: str | Path, evidence: dict,
                    served_at: str | Path | None = None) -> list[Path]:
    """Write every served sage_binary candidate the gate judged (promoted or not) as the checkpoint SAGE
    would load, under ``dest/<name>/``: what a refusal refused can be audited (and valued, where the
    truth is known: the model world). ``served_at``: the folder ``dest`` is published as (a staged
    version of an ``artifacts.atomic_set``), recorded in each manifest instead of the staged path."""
    out = []
    for name, sel in served.items():
        sage_router.write_sage_checkpoint(Path(dest) / name, sel.policy, {
            "policy": name, "source": sel.source, "min_confidence_selected_by": sel.how, **evidence},
            served_at=Path(served_at) / name if served_at is not None else None)
        out.append(Path(dest) / name)
    return out


# ------------------------------------------------------------------ the gate's decision, staged
# offline_eval stages what passed its gate in one folder (``checkpoints/gate/``): decision.json and,
# per action space that promoted, the policy as it will be published; the promoted_policy asset
# publishes it (``checkpoints/promoted/``, ``checkpoints/promoted_sage/``) once the decision checks.
DECISION_FILE = "decision.json"
GATE_SPACES = {"multi_model": "promoted", "sage_binary": "promoted_sage"}  # space -> published folder


def write_decision(gate_dir: str | Path, decided_at: str, dataset_sha256: str,
                   spaces: dict[str, GateDecision]) -> Path:
    """``decision.json`` of a staged gate: per evaluated space the promoted policy (or None) and why."""
    return artifacts.write_json(Path(gate_dir) / DECISION_FILE, {
        "decided_at": decided_at, "dataset_sha256": dataset_sha256,
        "spaces": {k: {"promoted": d.promoted, "reason": d.reason, "staged": k if d.promoted else None}
                   for k, d in spaces.items()}})


def read_decision(gate_dir: str | Path) -> dict:
    p = Path(gate_dir) / DECISION_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: no gate decision is staged; materialize offline_eval first")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{p}: not JSON ({e}); re-materialize offline_eval") from None
    if not isinstance(d, dict) or not isinstance(d.get("spaces"), dict):
        raise ValueError(f"{p}: not a gate decision (an object with 'spaces' expected); re-materialize offline_eval")
    bad = [k for k in ("decided_at", "dataset_sha256") if k not in d]
    unknown = [k for k in d["spaces"] if k not in GATE_SPACES]
    if bad or unknown:
        raise ValueError(f"{p}: not a gate decision (missing {bad}, unknown spaces {unknown}); re-materialize "
                         "offline_eval")
    return d


def check_decision(gate_dir: str | Path, dataset_sha256: str, load: dict[str, Callable[[Path], object]]) -> list[str]:
    """What is wrong with the staged decision (empty: nothing): it must be for ``dataset_sha256``, and
    each promoted space's staged policy must exist, load (``load[space](folder)``) and record the same
    dataset."""
    gate_dir = Path(gate_dir)
    try:
        d = read_decision(gate_dir)
    except (OSError, ValueError) as e:
        return [str(e)]
    problems = []
    if d["dataset_sha256"] != dataset_sha256:
        problems.append(f"the decision is for dataset {d['dataset_sha256'][:12]}, the dataset now is "
                        f"{dataset_sha256[:12]}: re-materialize offline_eval")
    for space, entry in d["spaces"].items():
        if not entry.get("promoted"):
            continue
        folder = gate_dir / entry["staged"]
        try:
            load[space](folder)
            staged = json.loads((folder / ("promotion.json" if space == "multi_model" else "manifest.json"))
                                .read_text(encoding="utf-8"))
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            problems.append(f"{space}: the staged {entry['promoted']!r} at {folder} does not load: {e}")
            continue
        if staged.get("dataset_sha256") != dataset_sha256:
            problems.append(f"{space}: the staged {entry['promoted']!r} records dataset "
                            f"{str(staged.get('dataset_sha256'))[:12]}, not {dataset_sha256[:12]}")
    return problems


def publish(gate_dir: str | Path, space: str, dest: str | Path) -> Path:
    """Copy a staged space's promoted policy to ``dest`` as one (``artifacts.atomic_dir``)."""
    entry = read_decision(gate_dir)["spaces"][space]
    src = Path(gate_dir) / entry["staged"]
    with artifacts.atomic_dir(dest) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True, symlinks=False)
    return Path(dest)


# ------------------------------------------------------------------ propensities, selection
PROPENSITY_FLOOR = 1e-3


def fill_missing_propensities(df: pd.DataFrame, behaviour_model) -> tuple[pd.DataFrame, int]:
    """Logs without propensities: use the (calibrated BC) behaviour model's probability of
    the logged action, floored at PROPENSITY_FLOOR. Returns the frame and how many rows
    were filled; ``propensity_source`` says ``estimated_bc`` on those rows."""
    missing = df["propensity"].isna().to_numpy()
    if not missing.any():
        return df, 0
    sub = df.loc[missing]
    probs = behaviour_model.action_probs(Contexts.from_frame(sub, behaviour_model.spec.roles))
    p = probs[np.arange(len(sub)), sub["action_index"].to_numpy(dtype=np.int64)]
    out = df.copy()
    out.loc[missing, "propensity"] = np.maximum(p, PROPENSITY_FLOOR)
    out.loc[missing, "propensity_source"] = "estimated_bc"
    return out, int(missing.sum())


SUPPORT_RULES = ("logged_pairs", "behaviour")


# ------------------------------------------------------------------ support, said plainly
# A decision's context, for telling deterministic logs from exploring ones: (role, score, primary
# failure count) with the score rounded to this many decimals. SAGE's router is a deterministic
# function of exactly these through YAML thresholds (`task_complexity_score > 0.8`,
# `primary_failure_count >= 2`), and SAGE logs the float its heuristic computed: any coarser bucket
# that straddles a threshold would show both models from a router that never explores. Six decimals
# only merges the same score printed twice.
SCORE_DECIMALS = 6
# Propensities that are evidence of exploration: logged by the behaviour policy or reconstructed
# exactly from its MODEL_ROUTING_DECISION; BC's estimates are not (on deterministic logs BC's near-0/1
# probabilities would turn into weights and tight intervals for decisions no one ever made).
NOT_EVIDENCE = ("missing", "estimated_bc")


@dataclass(frozen=True)
class RoleSupport:
    """Per role: how many of its logged decisions could say what another model would have done."""

    role: str
    decisions: int
    with_support: int  # decisions whose exact context also saw another candidate, or explored knowingly
    known_propensity: int  # decisions with a logged or reconstructed exploration probability below 1
    policy_sources: dict[str, int] = field(default_factory=dict)  # SAGE's policy_source counts (yaml, learned)

    @property
    def share(self) -> float:
        return self.with_support / self.decisions if self.decisions else 0.0

    @property
    def deterministic(self) -> bool:
        return self.decisions > 0 and self.with_support == 0

    def to_dict(self) -> dict:
        return {"role": self.role, "decisions": self.decisions, "with_support": self.with_support,
                "share_with_support": self.share, "known_propensity": self.known_propensity,
                "deterministic": self.deterministic, "policy_sources": self.policy_sources}


@dataclass(frozen=True)
class LoggedSupport:
    """Where the logs can value a change of decision: per evaluated decision, the actions of its role
    its exact context (:data:`SCORE_DECIMALS`) was also logged with, or every candidate where its
    exploration probability is known (:data:`NOT_EVIDENCE`); per role, the share of decisions with
    another candidate supported."""

    space: str
    supported: np.ndarray = field(repr=False)  # (n, K) bool over the evaluated rows
    role: np.ndarray = field(repr=False)  # (n,) role index of each evaluated row
    action: np.ndarray = field(repr=False)  # (n,) logged action
    actions: tuple[str, ...]
    role_names: tuple[str, ...]  # what ``role`` indexes (the space's roles)
    roles: dict[str, RoleSupport]  # the roles with evaluated decisions

    def to_dict(self) -> dict:
        return {"space": self.space, "score_decimals": SCORE_DECIMALS,
                "roles": [r.to_dict() for r in self.roles.values()]}

    def deterministic_roles(self) -> str | None:
        """One sentence naming the roles whose logs support no change of decision, or None."""
        det = [r for r in self.roles.values() if r.deterministic]
        if not det:
            return None
        sources: dict[str, int] = {}
        for r in det:
            for k, v in r.policy_sources.items():
                sources[k] = sources.get(k, 0) + v
        fix = (BANDIT_FIX if set(sources) == {"ucb_bandit"} else
               "deploy the exploring checkpoint to collect support" + ("; " + BANDIT_FIX if "ucb_bandit" in sources
                                                                      else ""))
        return (f"roles {', '.join(r.role for r in det)} were logged {_who_decided(sources)}: no change of decision "
                f"there can be valued; {fix}")

    def refusal(self, policy: str, probs: np.ndarray, max_mass: float) -> str | None:
        """Why ``policy`` (its (n, K) probabilities on the evaluated rows) cannot be judged on these
        logs, one sentence per role where it puts more than ``max_mass`` (mean per decision) on
        actions the logs do not support; None when it changes nothing unsupported."""
        off = probs * ~self.supported
        mass = off.sum(axis=1)
        out = []
        bandit = routed = False
        for r, name in enumerate(self.role_names):
            rows = self.role == r
            if name not in self.roles or mass[rows].mean() <= max_mass:
                continue
            rs = self.roles[name]
            dev = rows & (mass > 1e-12)
            changed = int((rows & (probs.argmax(axis=1) != self.action) & (mass > 0.5)).sum())
            logged = self.actions[np.bincount(self.action[dev], minlength=len(self.actions)).argmax()]
            target = self.actions[off[dev].sum(axis=0).argmax()]
            if rs.deterministic:
                who = _who_decided(rs.policy_sources)
                head = f"role {name}: every logged decision was made {who}"
            else:
                head = (f"role {name}: only {rs.with_support} of {rs.decisions} logged decisions "
                        f"({rs.share:.0%}) saw another model in the same context")
            how = (f"{policy} changes {changed} of {int(rows.sum())} {name} decisions there" if changed else
                   f"{policy} puts {mass[rows].mean():.1%} of its probability there")
            out.append(f"{head}, so the logs cannot say what {target} would have done where {logged} was chosen "
                       f"({how})")
            bandit = bandit or "ucb_bandit" in rs.policy_sources
            routed = routed or set(rs.policy_sources) != {"ucb_bandit"}
        if not out:
            return None
        fixes = []
        if routed:
            fixes.append("deploy the exploring checkpoint (SAGE's router then tries the other model with a known "
                         "probability) to collect support")
        if bandit:
            fixes.append(BANDIT_FIX)
        return "; ".join(out) + ". " + "; ".join(fixes)[:1].upper() + "; ".join(fixes)[1:]


# SAGE's coder never calls ModelRouter.select (sage/agents/coder.py): its UCB bandit picks the model
BANDIT_FIX = ("the coder's model is chosen by SAGE's UCB bandit (sage/rl/ucb_bandit.py), which SAGE's router "
              "checkpoint does not reach, so no checkpoint can explore or change the coder's choice")


def _who_decided(sources: dict[str, int]) -> str:
    if sources and set(sources) == {"yaml"}:
        return "by SAGE's deterministic YAML table"
    if sources and set(sources) == {"ucb_bandit"}:
        return "by SAGE's coder bandit, whose probabilities the journal does not hold"
    if sources and set(sources) <= {"yaml", "learned"}:
        return "by SAGE's YAML table or a checkpoint it loaded, neither of which explores"
    return "deterministically (no context was logged with two models, and no exploration probability was logged)"


def context_keys(df: pd.DataFrame) -> np.ndarray:
    """One key per row (uint64, a stable hash): (role, task_complexity_score to :data:`SCORE_DECIMALS`,
    primary_failure_count)."""
    score = np.rint(df["task_complexity_score"].to_numpy(dtype=np.float64) * 10.0**SCORE_DECIMALS)
    cols = pd.DataFrame({"role": df["role"].astype(str).to_numpy(), "score": score.astype(np.int64),
                         "pfc": df["primary_failure_count"].to_numpy(dtype=np.float64, na_value=-1).astype(np.int64)})
    return pd.util.hash_pandas_object(cols, index=False).to_numpy()


def _known_exploration(df: pd.DataFrame) -> np.ndarray:
    p = df["propensity"].astype("float64").to_numpy(na_value=np.nan)
    known = np.isfinite(p) & (p < ope.DETERMINISTIC_PSCORE)
    if "propensity_source" in df:
        known &= ~df["propensity_source"].astype(str).isin(NOT_EVIDENCE).to_numpy()
    return known


def logged_support(df_eval: pd.DataFrame, space: ActionSpace | ModelCatalogue,
                   evidence: pd.DataFrame | None = None, name: str | None = None) -> LoggedSupport:
    """:class:`LoggedSupport` of the rows of ``df_eval`` in ``space``; ``evidence``: the rows whose contexts
    count (default ``df_eval``; offline_eval passes the whole dataset: the behaviour's randomness shows in
    any split)."""
    evidence = df_eval if evidence is None else evidence
    mask = space.role_mask()
    K, roles = len(space.actions), tuple(space.roles)
    ctx = Contexts.from_frame(df_eval, roles) if len(df_eval) else None
    role = ctx.role if ctx is not None else np.zeros(0, dtype=np.int64)
    action = df_eval["action_index"].to_numpy(dtype=np.int64)
    supported = np.zeros((len(df_eval), K), dtype=bool)
    supported[np.arange(len(df_eval)), action] = True
    if len(df_eval):
        keys, ev_keys = context_keys(df_eval), context_keys(evidence)
        seen = pd.DataFrame({"k": ev_keys, "a": evidence["action_index"].to_numpy(dtype=np.int64)}).drop_duplicates()
        codes = pd.Index(pd.unique(keys))
        at = codes.get_indexer(seen["k"].to_numpy())
        pairs = np.zeros((len(codes), K), dtype=bool)
        ok = at >= 0
        pairs[at[ok], seen["a"].to_numpy()[ok]] = True
        supported |= pairs[codes.get_indexer(keys)]
        known = _known_exploration(df_eval)
        supported[known] |= mask[role[known]]
        supported &= mask[role] | (np.arange(K) == action[:, None])
    other = (supported & ~(np.arange(K) == action[:, None])).any(axis=1)
    known = _known_exploration(df_eval) if len(df_eval) else np.zeros(0, dtype=bool)
    sources = (df_eval["policy_source"].fillna("none").astype(str).to_numpy(dtype=object)
               if "policy_source" in df_eval else np.full(len(df_eval), "none", dtype=object))
    per_role = {}
    for r, rname in enumerate(roles):
        rows = role == r
        if not rows.any():
            continue
        src = pd.Series(sources[rows]).value_counts()
        per_role[rname] = RoleSupport(rname, int(rows.sum()), int(other[rows].sum()), int(known[rows].sum()),
                                      {str(k): int(v) for k, v in src.items() if k != "none"})
    return LoggedSupport(name or getattr(space, "name", "multi_model"), supported, role, action,
                         tuple(space.actions), roles, per_role)


def _evaluate_all(policies: dict[str, object], data: ope.LoggedData, config: ope.OPEConfig, behaviour,
                  progress: Callable[[str], None], keep_terms: bool = True,
                  intervals: tuple[str, ...] | None = None,
                  support: LoggedSupport | None = None) -> dict[str, ope.PolicyEvaluation]:
    """Every policy's evaluation; with a ``behaviour`` model (BC) support is the behaviour
    policy's (its probabilities), else the sample's (logged (role, model) pairs). ``keep_terms``:
    keep the per-unit terms the paired gate needs (a selection does not); ``intervals``: the
    estimators whose interval is computed (:func:`ope.evaluate_policy`; default all); ``support``: where
    the logs can value a change of decision (:func:`logged_support`), on top of either rule."""
    bp = ope.policy_probs(behaviour, data) if behaviour is not None else None
    sup = support.supported if support is not None else None
    return {name: ope.evaluate_policy(data, pol, config, behaviour_probs=bp, progress=progress,
                                      keep_terms=keep_terms, intervals=intervals, supported=sup)
            for name, pol in policies.items()}


SELECTION_CRITERIA = ("fqe", "estimate", "lower_bound")
SELECTION_ESTIMATOR = {"fqe": "fqe", "estimate": GATE_ESTIMATOR, "lower_bound": GATE_ESTIMATOR}
SELECTION_LABEL = {"fqe": "fqe estimate", "estimate": f"{GATE_ESTIMATOR} estimate",
                   "lower_bound": f"{GATE_ESTIMATOR} lower bound"}


def select_by_ope(candidates: dict[str, object], df_eval: pd.DataFrame, catalogue: ActionSpace | ModelCatalogue,
                  config: ope.OPEConfig = ope.OPEConfig(), criterion: str = "fqe",
                  progress: Callable[[str], None] = log.info,
                  behaviour=None, evidence: pd.DataFrame | None = None,
                  ) -> tuple[str | None, dict[str, ope.PolicyEvaluation]]:
    """Pick the candidate OPE values most on the eval rows; never reads ground truth.

    ``criterion``: ``fqe`` (default), the highest fitted-Q evaluation estimate; ``estimate``,
    the highest estimate of the gate's estimator (:data:`GATE_ESTIMATOR`, clipped step-wise
    DR); ``lower_bound``, the highest lower bound of its interval (favours policies close to
    the logs). FQE is the default because it ranks
    far better: candidates that differ in a few decisions get nearly the same DR estimate up
    to importance-weight noise several times their true difference, while FQE, with no
    weights, keeps their difference (measured in docs/benchmarks.md; Paine et al. 2020 also
    rank offline-RL hyperparameters by fitted-Q evaluation). Its model's bias hurts a ranking only
    where it differs between candidates; the estimates that are reported and gated stay the
    importance-weighted ones (:data:`GATE_ESTIMATOR`), unbiased where the model is right.
    ``None`` when no candidate has support in the eval rows (each evaluation says why). Only
    :data:`GATE_ESTIMATOR`'s interval is computed (the one a selection reports and
    ``lower_bound`` reads); every other estimator gets its value alone. Support is also the logs'
    (:func:`logged_support` of ``df_eval``, contexts from ``evidence``). No rows: ``(None, {})``; too few
    sessions for an interval, ``lower_bound`` ranks nothing (``None``).
    """
    if criterion not in SELECTION_CRITERIA:
        raise ValueError(f"criterion must be one of {SELECTION_CRITERIA}, got {criterion!r}")
    if df_eval.empty:
        progress("OPE selection: no eval decisions to rank the candidates on")
        return None, {}
    data = ope.LoggedData.from_frame(df_eval, catalogue.actions, catalogue.roles)
    evals = _evaluate_all(candidates, data, config, behaviour, progress, keep_terms=False,
                          intervals=(GATE_ESTIMATOR,), support=logged_support(df_eval, catalogue, evidence))
    key = SELECTION_ESTIMATOR[criterion]
    pick = (lambda e: e.ci_low) if criterion == "lower_bound" else (lambda e: e.value)
    scored = {n: pick(e.estimates[key]) for n, e in evals.items() if pick(e.estimates[key]) is not None}
    return (max(scored, key=scored.get) if scored else None), evals


DEFAULT_ALPHAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)
SELECT_FRACTION = 0.5  # share of eval sessions that choose alpha; the rest report


def eval_part(df: pd.DataFrame, part: str) -> pd.DataFrame:
    """The eval split's ``select`` part (sessions that choose CQL's alpha) or its
    ``report`` part (sessions every policy is finally evaluated on), by a stable session
    hash. Choosing and reporting on the same sessions would make the chosen policy's
    estimate optimistic (the winner's curse) and its interval cover too rarely."""
    if part not in ("select", "report"):
        raise ValueError(f"part must be 'select' or 'report', got {part!r}")
    ev = df[df["split"] == "eval"]
    side = session_split(ev["session_id"], SELECT_FRACTION, "sage-eval-part")  # "eval" = select
    return ev[(side == "eval") == (part == "select")]


# Episodes (tasks) an eval half needs for OPE to be trusted on epsilon-0.3 logs, measured over
# 50 seeds (docs/benchmarks.md): at ~500 per half the alpha chosen closed >= 0.7 of the
# table's regret in 72% of seeds and greedy policies' estimates erred by 5% on average; at
# ~1,000, 93%; at ~2,000 (the default data), 100% and 2.2%.
MIN_RELIABLE_EPISODES = 1000
MIN_SESSIONS = ope.OPESettings.model_fields["min_sessions"].default  # declared once, in OPESettings


def sample_size_warning(n_episodes: int, part: str, n_sessions: int | None = None,
                        min_sessions: int = MIN_SESSIONS) -> str | None:
    """What to tell the user when an eval half is too small to trust, or None: fewer episodes than
    OPE was measured reliable on, or fewer sessions than an interval needs (``n_sessions``: the
    sessions of the half; a session's decisions are one draw, so episodes alone overstate the data)."""
    parts = []
    if n_episodes < MIN_RELIABLE_EPISODES:
        parts.append(f"{n_episodes} episodes, under the {MIN_RELIABLE_EPISODES} at which OPE was measured reliable "
                     "(docs/benchmarks.md, 'Offline chain quality')")
    if n_sessions is not None and n_sessions < min_sessions:
        parts.append(f"{n_sessions} sessions, under the {min_sessions} a 95% interval needs (OPE setting "
                     "min_sessions)")
    if not parts:
        return None
    few_sessions = n_sessions is not None and n_sessions < min_sessions
    return (f"the eval split's {part} half has " + " and ".join(parts) + ": "
            + ("the alpha chosen may be far from the best" if part == "select" else
               "no interval is given and the gate refuses" if few_sessions else
               "estimates of policies far from the logs can be several percent off")
            + "; log more sessions (SAGE writes one per journal file, a day, unless SAGE_SESSION_ID is set, as "
              "`sage run` does per run) or raise routing_dataset's eval_fraction")


def _unranked(select: pd.DataFrame, evals: dict[str, ope.PolicyEvaluation], criterion: str) -> str:
    """Why :func:`select_by_ope` ranked no candidate."""
    if select.empty:
        return "the eval split's select half has no decisions (0 sessions)"
    if criterion == "lower_bound" and any(e.value is not None for e in evals.values()):
        return f"no interval to rank by ({next(iter(evals.values())).interval_reason})"
    return "no candidate has support in the eval split"


@dataclass(frozen=True)
class CQLSelection:
    result: object  # cql.CQLResult of the chosen alpha
    label: str
    how: str  # what chose it
    table: list[dict]  # one row per alpha: OPE estimate, interval, ESS, support, chosen
    n_episodes: int = 0  # episodes of the select half
    warning: str | None = None  # sample_size_warning of the select half


def train_select_cql(df: pd.DataFrame, catalogue: ActionSpace | ModelCatalogue, config, alphas=DEFAULT_ALPHAS,
                     ope_config: ope.OPEConfig = ope.OPEConfig(n_boot=300), criterion: str = "fqe",
                     progress: Callable[[str], None] = log.info, behaviour=None) -> CQLSelection:
    """Train CQL for every alpha on the train split (one batched run) and keep the one OPE
    prefers on the eval split's ``select`` part (:func:`select_by_ope`, :func:`eval_part`).
    If no alpha is supported there, keep the most conservative (largest) one and say so.
    In the ``sage_binary`` space CQL learns from the decisions that took the primary or the
    fallback (:meth:`LoggedDecisions.restrict`); OPE still reads every eval decision."""
    data = from_dataset(df, catalogue).split_rows("train")
    if isinstance(catalogue, ActionSpace):
        data = data.restrict(catalogue)
    results = cql.train_cql_grid(data, FeatureSpec(roles=tuple(catalogue.roles)), config, list(alphas), log=progress)
    cands = {f"alpha={a:g}": r.policy() for a, r in zip(alphas, results)}
    select = eval_part(df, "select")
    best, evals = select_by_ope(cands, select, catalogue, ope_config, criterion, progress, behaviour, evidence=df)
    how = f"{SELECTION_LABEL[criterion]} on the eval split's select part"
    if best is None:
        best, how = list(cands)[int(np.argmax(alphas))], (
            "largest alpha: " + _unranked(select, evals, criterion))
    table = [{"alpha": n, "fqe": e.estimates["fqe"].value, GATE_ESTIMATOR: e.estimates[GATE_ESTIMATOR].value,
              "ci_low": e.estimates[GATE_ESTIMATOR].ci_low, "ci_high": e.estimates[GATE_ESTIMATOR].ci_high,
              "ess_episodes": e.ess_episode, "no_support": e.no_support_reason, "chosen": n == best}
             for n, e in evals.items()]
    n_episodes = next(iter(evals.values())).n_episodes if evals else 0
    warning = sample_size_warning(n_episodes, "select", select["session_id"].nunique(), ope_config.min_sessions)
    if warning:
        progress(f"WARNING: {warning}")
    return CQLSelection(results[list(cands).index(best)], best, how, table, n_episodes, warning)


@dataclass(frozen=True)
class ServedSelection:
    """A sage_binary policy as SAGE's router would serve it, and how its floor was chosen."""

    policy: object  # sage_router.ServedSagePolicy: distilled classifiers + floor + YAML fallback
    source: str  # the trained policy it was distilled from
    how: str
    table: list[dict]  # one row per min_confidence tried: OPE estimate, interval, chosen
    agreement_train: dict[str, float]  # per role: distilled decision == the policy's, train states
    agreement_eval: dict[str, float]  # the same on the eval split's states


def agreement_by_role(served, trained, ctx: Contexts, space: ActionSpace) -> dict[str, float]:
    """Per role: the share of ``ctx`` rows where the distilled classifier (no floor) decides
    as the trained policy does."""
    a = sage_router.fallback_labels(served.with_min_confidence(0.0), ctx, space)
    b = sage_router.fallback_labels(trained, ctx, space)
    return {r: float((a[ctx.role == i] == b[ctx.role == i]).mean()) for i, r in enumerate(space.roles)
            if (ctx.role == i).any()}


def distill_select_served(df: pd.DataFrame, space: ActionSpace, table: RoutingTable, trained, source: str,
                          config=None, ope_config: ope.OPEConfig = ope.OPEConfig(n_boot=300),
                          criterion: str = "fqe", progress: Callable[[str], None] = log.info,
                          behaviour=None) -> ServedSelection:
    """What SAGE would run: ``trained`` (a sage_binary policy) distilled into one classifier per
    role on the train split's states, served behind SAGE's confidence floor with the YAML
    table as fallback; the floor is chosen by OPE on the eval split's select half (as CQL's
    alpha, :func:`select_by_ope`), never by ground truth."""
    config = config or sage_router.SageRouterConfig()
    ctx_train = Contexts.from_frame(df[df["split"] == "train"], space.roles)
    distilled = sage_router.distill(trained, ctx_train, space, config)
    base = sage_router.ServedSagePolicy.from_distilled(distilled, table, space, config.default_min_confidence,
                                                       name=f"{source}_served")
    cands = {f"min_confidence={c:g}": base.with_min_confidence(c) for c in config.min_confidence_grid}
    select = eval_part(df, "select")
    best, evals = select_by_ope(cands, select, space, ope_config, criterion, progress, behaviour, evidence=df)
    how = f"{SELECTION_LABEL[criterion]} on the eval split's select part"
    if best is None:
        best, how = (f"min_confidence={config.default_min_confidence:g}",
                     "SAGE's default: " + _unranked(select, evals, criterion).replace("candidate", "floor"))
        cands.setdefault(best, base)
    table_rows = [{"min_confidence": n.split("=")[1], "fqe": e.estimates["fqe"].value,
                   GATE_ESTIMATOR: e.estimates[GATE_ESTIMATOR].value, "ci_low": e.estimates[GATE_ESTIMATOR].ci_low,
                   "ci_high": e.estimates[GATE_ESTIMATOR].ci_high, "no_support": e.no_support_reason,
                   "chosen": n == best} for n, e in evals.items()]
    chosen = cands[best]
    df_eval = df[df["split"] == "eval"]
    progress(f"{source}: served with {best} ({how})")
    agreement = (agreement_by_role(chosen, trained, Contexts.from_frame(df_eval, space.roles), space)
                 if len(df_eval) else {})
    return ServedSelection(chosen, source, how, table_rows, dict(distilled.agreement), agreement)


# ------------------------------------------------------------------ the report
@dataclass(frozen=True)
class OfflineEvalReport:
    evaluations: dict[str, ope.PolicyEvaluation]
    truth: GroundTruth | None
    gate: GateDecision
    warning: str | None = None  # sample_size_warning of the report half
    n_sessions: int = 0  # sessions of the report half: the units every interval resamples
    n_episodes: int = 0
    min_sessions: int = MIN_SESSIONS  # the sessions an interval needs (OPESettings.min_sessions)
    interval_reason: str | None = None  # why no interval is given (too few sessions), or None
    support: LoggedSupport | None = None  # per role: how much of the logs can value a change of decision

    def rows(self) -> list[dict]:
        """One row per (policy, estimator): estimate, interval, truth, relative error."""
        out = []
        for name, ev in self.evaluations.items():
            for est, e in ev.estimates.items():
                truth = None
                if self.truth is not None:
                    table = self.truth.episode_value if e.scope == "episode" else self.truth.first_step_value
                    truth = table.get(name)
                rel = (abs(e.value - truth) / abs(truth)) if (e.value is not None and truth) else None
                out.append({"policy": name, "estimator": est, "scope": e.scope, "estimate": e.value,
                            "ci_low": e.ci_low, "ci_high": e.ci_high, "ground_truth": truth,
                            "relative_error": rel,
                            "covered": (None if truth is None or e.value is None or e.ci_low is None
                                        else bool(e.ci_low <= truth <= e.ci_high))})
        return out

    def summary(self) -> list[dict]:
        """One row per policy: headline estimate, ESS, support, truth, regret closure."""
        out = []
        for name, ev in self.evaluations.items():
            e = ev.estimates[GATE_ESTIMATOR]
            row = {"policy": name, GATE_ESTIMATOR: e.value, "ci_low": e.ci_low, "ci_high": e.ci_high,
                   "sessions": ev.n_sessions, "ess_episodes": ev.ess_episode, "support_share": ev.support_share,
                   "clipped_at_weight": ev.clip_weight, "no_support": ev.no_support_reason}
            if self.truth is not None:
                gt = self.truth.episode_value
                row |= {"ground_truth": gt[name],
                        "regret_closure": regret_closure(gt[name], gt[STATIC], gt["oracle"])}
            out.append(row)
        if self.truth is not None:
            out.append({"policy": "oracle", "ground_truth": self.truth.episode_value["oracle"],
                        "regret_closure": 1.0})
        return out

    def to_dict(self) -> dict:
        return {
            "summary": self.summary(), "estimates": self.rows(),
            "evaluations": {k: v.to_dict() for k, v in self.evaluations.items()},
            "ground_truth": asdict(self.truth) if self.truth else None,
            "gate": asdict(self.gate), "sample_size_warning": self.warning,
            "sessions": {"n_sessions": self.n_sessions, "n_episodes": self.n_episodes,
                         "min_sessions": self.min_sessions, "intervals": self.interval_reason or "given"},
            "support_by_role": self.support.to_dict() if self.support is not None else None,
        }

    def support_table(self) -> list[dict]:
        """Per role: decisions, the share whose context also saw another model, deterministic or not."""
        return [r.to_dict() for r in self.support.roles.values()] if self.support is not None else []


OBJECTIVES = ("task", "reward_v1")


def objective_rows(df: pd.DataFrame, outcomes: pd.DataFrame | None, objective: str = "task",
                   simulated: bool = False) -> tuple[pd.DataFrame, dict]:
    """The rows OPE and the gate judge, and what they are judged on.

    ``objective="task"`` (the default): each episode's return is its task's per-task objective
    (``task_outcomes.objective_rewards``: verified minus the task's priced calls, task_v1 by default) when
    SAGE's journals gave task outcomes for the episodes; episodes with an unknown verdict or no task are
    left out and counted. Two cases keep reward_v1, said in the result: ``simulated`` data (the routing
    simulator's synthetic sessions, whose exact truth is in reward_v1: the judged numbers then stay
    comparable to it) and journals with no ``sage run`` task at all. ``objective="reward_v1"``: SAGE's
    per-decision reward summed over the episode, for comparison only: it pays a repaired failure more than
    a first-try pass (docs/architecture.md)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}; got {objective!r}")
    base = {"judged_on": "reward_v1", "episodes": int(df["episode_id"].nunique()) if len(df) else 0}
    if objective == "reward_v1":
        return df, base | {"why": "objective: reward_v1 was asked for (comparison only: never the objective)"}
    if simulated:
        return df, base | {"why": "the routing simulator's synthetic sessions: their exact truth is in reward_v1, "
                                  "so they are judged on it against that truth"}
    if outcomes is None or outcomes.empty or outcomes["verified"].notna().sum() == 0:
        return df, base | {"why": "no `sage run` task with a known verdict in these journals (task_outcomes): "
                                  "nothing to judge the task objective on"}
    out, report = task_outcomes.objective_rewards(df, outcomes)
    if out.empty:
        return df, base | {"why": "no routing episode joins a task with a known verdict", **report}
    return out, report | {"judged_on": str(out["reward_version"].iloc[0]),
                          "why": "each episode's return is its task's objective (task_outcomes.parquet)"}


def one_outcome_reason(df_eval: pd.DataFrame) -> str | None:
    """Why no interval can be trusted on ``df_eval`` (rows :func:`objective_rows` scored), or None: when every
    task of the report half ended the same way (all verified, or none), every bootstrap resample does too,
    and a percentile interval shrinks around a value whose other outcome the sample never showed (in the
    model world a 5% failure rate leaves 60 tasks all verified about 5% of the time, and the interval then
    sat 0.05 above the truth). The estimate stays; its interval and the gate say the data cannot tell."""
    if "task_verified" not in df_eval or df_eval.empty:
        return None
    v = df_eval.groupby("episode_id", sort=False)["task_verified"].first()
    if v.nunique() != 1:
        return None
    which = "verified" if v.iloc[0] == 1 else "not verified"
    return (f"every one of the report half's {len(v)} tasks ended {which}: a bootstrap over them cannot show the "
            "chance of the other outcome, so no interval is given (more tasks, or days, will show it)")


def _without_intervals(evals: dict[str, ope.PolicyEvaluation], reason: str) -> dict[str, ope.PolicyEvaluation]:
    return {k: replace(ev, estimates={n: replace(e, ci_low=None, ci_high=None) for n, e in ev.estimates.items()},
                       interval_reason=reason) for k, ev in evals.items()}


def run_offline_eval(df_eval: pd.DataFrame, policies: dict[str, object], catalogue: ModelCatalogue,
                     config: ope.OPEConfig = ope.OPEConfig(), sim: RoutingSimulator | None = None,
                     progress: Callable[[str], None] = log.info, behaviour=None, oracle=None,
                     candidates: tuple[str, ...] | None = None,
                     gate: PromotionGateConfig = PromotionGateConfig(),
                     evidence: pd.DataFrame | None = None, no_interval: str | None = None) -> OfflineEvalReport:
    """Evaluate ``policies`` (must include ``static_table``) on the eval rows; ``behaviour``:
    see :func:`_evaluate_all`; ``oracle``: see :func:`ground_truth`; ``candidates``,
    ``gate``: the policies the gate may promote and its rule
    (:func:`promotion_gate`); ``evidence``: the rows whose contexts show where the behaviour explored
    (:func:`logged_support`; default ``df_eval``); ``no_interval``: why no interval can be trusted on these
    rows (:func:`one_outcome_reason`): the estimates are kept, without intervals, and nothing is promoted.

    Never raises on a small journal set: with no rows, or fewer sessions than ``config.min_sessions``,
    the report says how many sessions it has and needs and the gate refuses with that sentence; a
    candidate that changes decisions where the logs hold no other action is refused per role
    (:meth:`LoggedSupport.refusal`)."""
    if STATIC not in policies:
        raise ValueError(f"policies must include {STATIC!r}: it is the baseline every policy is compared with")
    n_sessions = int(df_eval["session_id"].nunique()) if len(df_eval) else 0
    n_episodes = int(df_eval["episode_id"].nunique()) if len(df_eval) else 0
    warning = sample_size_warning(n_episodes, "report", n_sessions, config.min_sessions)
    if warning:
        progress(f"WARNING: {warning}")
    if df_eval.empty:
        why = f"the eval split's report half is empty: {ope.session_shortfall(0, config.min_sessions)}"
        progress(f"offline_eval: {why}")
        return OfflineEvalReport({}, None, GateDecision(None, f"no policy promoted: {why}", rule=gate.rule,
                                                        min_gain=gate.min_gain),
                                 warning, 0, 0, config.min_sessions, why, None)
    data = ope.LoggedData.from_frame(df_eval, catalogue.actions, catalogue.roles)
    support = logged_support(df_eval, catalogue, evidence)
    evals = _evaluate_all(policies, data, config, behaviour, progress, support=support)
    unsupported = {}
    for name, pol in policies.items():
        if name == STATIC or candidates is None or name in candidates:
            why = support.refusal(name, ope.policy_probs(pol, data), config.max_unsupported_mass)
            if why:
                unsupported[name] = why
    truth = ground_truth(sim, eval_tasks(data), policies, oracle) if sim is not None else None
    decision = promotion_gate(evals, candidates=candidates, gate=gate, unsupported=unsupported)
    if no_interval:
        evals = _without_intervals(evals, no_interval)
        decision = replace(decision, promoted=None, reason=f"no policy promoted: {no_interval}",
                           candidates={n: c | {"passed": False} for n, c in decision.candidates.items()})
    det = support.deterministic_roles()
    if decision.promoted is None and det:  # say it even where no candidate changed a decision there
        if "exploring checkpoint" in decision.reason:  # the advice once
            det = det.replace("; deploy the exploring checkpoint to collect support", "")
        decision = replace(decision, reason=f"{decision.reason}. Support: {det}")
    return OfflineEvalReport(evals, truth, decision, warning, evals[STATIC].n_sessions, n_episodes,
                             config.min_sessions, evals[STATIC].interval_reason, support)


# ------------------------------------------------------------------ the gate over nights: the ledger (issue 47)
GATE_MODES = ("ledger", "per_night")
GATE_MODE = "ledger"  # run_sage_binary_eval's default (the module doc says why)
NO_LEDGER = ("no promotion: the gate's mode is 'ledger' and no ledger was given (LedgerGateInputs: the decision "
             "ledger, tonight's night and the time tonight's candidates were trained up to); pass it, or "
             "mode='per_night' for tonight's one-night verdict, valid for one night only")


@dataclass(frozen=True)
class LedgerGateInputs:
    """What the ledger gate needs beside tonight's report (:func:`ledger_gate`).

    ``proposed_at``: the latest log time tonight's candidates were trained or selected on (they are judged on
    episodes that start after it); ``keys``: served name -> its checkpoint's sha256, the candidate's ledger key
    (default :func:`served_key`: the ``policy.joblib`` SAGE would load with its floor); ``paths``: served name ->
    where its checkpoint is kept for as long as the ledger may deploy it (content-addressed, not the nightly
    candidates folder); ``load(key, payload)``: the policy of a candidate of an earlier night (from
    ``payload['path']``), needed while one is pending or accepted; ``selected_on``: episode ids tonight's
    candidates were trained or selected on (never their evidence)."""

    ledger: Ledger
    night: str
    proposed_at: object
    keys: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    load: Callable[[str, dict], object] | None = None
    selected_on: tuple[str, ...] = ()
    config: ledger_router.RouterGateConfig = field(default_factory=ledger_router.RouterGateConfig)


def served_key(policy) -> str:
    """The router candidate's ledger key (``decisions.router.candidate_key``): the sha256 of the ``policy.joblib``
    :func:`sage_router.write_sage_checkpoint` writes for ``policy`` (the same bytes, dumped in memory) with the
    confidence floor SAGE applies to it (its ``min_confidence``, which the checkpoint's ``sage_env`` sets as
    SAGE_RL_MIN_CONFIDENCE): ``router.folder_key`` of the folder written."""
    buf = io.BytesIO()
    sage_router.dump_policy(policy, buf)
    return ledger_router.candidate_key(hashlib.sha256(buf.getvalue()).hexdigest(), policy.min_confidence)


def ledger_gate(per_night: GateDecision, served: dict[str, object], df: pd.DataFrame, space: ActionSpace,
                table: RoutingTable, inputs: LedgerGateInputs | None) -> GateDecision:
    """SAGE's binary space decided through the ledger's router lever (``decisions.router``): tonight's new
    episodes judge every pending candidate against the deployed policy and every accepted one against the
    policy it replaced (``router.judge``), then tonight's ``served`` candidates (name -> served policy) are
    proposed, to be judged on the episodes logged from now on. ``df``: the whole routing dataset frame, its
    ``reward`` the objective (:func:`objective_rows`) and its ``timestamp`` read; only exact propensities
    count. ``per_night``: tonight's per-night verdict, kept beside each of tonight's candidates
    (``per_night``, valid for one night only). Without ``inputs`` nothing is promoted (:data:`NO_LEDGER`).

    The decision: ``promoted`` is the ledger id of the candidate accepted tonight (None when none);
    ``ledger['deploy']`` says what SAGE should run after tonight (``key``, ``candidate``, ``path``; the table
    when key is ``router.TABLE``: a revert is a deploy like any other); ``candidates`` has one row per
    candidate judged or proposed tonight, by ledger id: state, estimate and interval (the ledger's
    confidence sequence at the candidate's level), evidence of needed, and why."""
    if inputs is None:
        rows = {n: c | {"passed": False, "per_night": f"{c.get('why')} (valid for one night only)"}
                for n, c in per_night.candidates.items()}
        return replace(per_night, promoted=None, mode="ledger", candidates=rows,
                       reason=f"{NO_LEDGER}. Tonight's per-night verdict: {per_night.reason}")
    led, cfg = inputs.ledger, inputs.config
    ep = ledger_router.Episodes.from_frame(df, cfg, follows_log_sources=ope.FOLLOWS_LOG_SOURCES)
    data = ope.LoggedData.from_frame(ep.frame, space.actions, space.roles) if len(ep.frame) else None
    keys = {n: inputs.keys.get(n) or served_key(p) for n, p in served.items()}
    tonight = {k: served[n] for n, k in keys.items()}
    static = StaticTablePolicy(table, space)

    def policy(key: str):
        if key == ledger_router.TABLE:
            return static
        if key in tonight:
            return tonight[key]
        c = led.find(ledger_router.LEVER, key)
        if inputs.load is None or c is None:
            raise ValueError(f"router candidate {c.id if c else key[:12]} is pending or accepted in the ledger: give "
                             "LedgerGateInputs.load to value its checkpoint (payload path "
                             f"{c.payload.get('path') if c else None})")
        return inputs.load(key, c.payload)

    def prob_of(key: str) -> np.ndarray:
        probs = ope.policy_probs(policy(key), data)
        return probs[np.arange(len(data)), data.action]

    night = ledger_router.judge(led, ep, prob_of, inputs.night)
    rows = dict(night.rows)
    for name, key in keys.items():
        c, _ = ledger_router.propose(led, key, night=inputs.night, proposed_at=inputs.proposed_at,
                                     selected_on=inputs.selected_on, description=name,
                                     payload={"name": name, "path": inputs.paths.get(name)})
        rows[c.id] = ledger_router.row(led, c) | {
            "name": name, "per_night": f"{per_night.candidates.get(name, {}).get('why')} (valid for one night only)"}
    dep = ledger_router.deployed_candidate(led)
    deploy = {"key": ledger_router.deployed_key(led), "candidate": dep.id if dep else None,
              "name": dep.payload.get("name") if dep else "static_table",
              "path": dep.payload.get("path") if dep else None}
    what = "SAGE's YAML table" if dep is None else f"{dep.id} ({deploy['name']}, {deploy['key'][:12]})"
    if night.accepted:
        c = led.get(night.accepted[0])
        reason = f"ledger: {c.id} accepted tonight, {c.history[-1].reason}; SAGE runs it from now on"
    elif night.reverted:
        reason = (f"ledger: {', '.join(night.reverted)} reverted tonight ("
                  f"{led.get(night.reverted[0]).history[-1].reason}); SAGE goes back to {what}")
    else:
        open_ = [f"{r['candidate']}: {r['why']}" for r in rows.values() if r["state"] in ("pending", "accepted")]
        reason = f"ledger: no change tonight; SAGE keeps {what}" + ("; " + "; ".join(open_) if open_ else "")
    return GateDecision(night.accepted[0] if night.accepted else None, reason, per_night.estimator,
                        per_night.static_estimate, rows, per_night.rule, per_night.min_gain, mode="ledger",
                        ledger={"night": inputs.night, "deployed_before": night.deployed_before,
                                "deployed_after": night.deployed_after, "accepted": night.accepted,
                                "reverted": night.reverted, "dropped": night.dropped, "deploy": deploy,
                                "episodes": len(ep), "episodes_without_timestamp": ep.no_start,
                                "weight_bound": cfg.max_weight()})


def run_sage_binary_eval(df: pd.DataFrame, df_eval: pd.DataFrame, space: ActionSpace, table: RoutingTable,
                         trained: dict[str, object], config: ope.OPEConfig = ope.OPEConfig(),
                         sim: RoutingSimulator | None = None, progress: Callable[[str], None] = log.info,
                         behaviour=None, criterion: str = "fqe", gate: PromotionGateConfig = PromotionGateConfig(),
                         no_interval: str | None = None, mode: str = GATE_MODE,
                         ledger: LedgerGateInputs | None = None
                         ) -> tuple[OfflineEvalReport, dict[str, ServedSelection]]:
    """SAGE's binary space, judged as SAGE would run it: each ``trained`` sage_binary policy is
    served (:func:`distill_select_served` on ``df``, propensities filled), the networks are
    reported beside as ``<name>_trained``, only the ``<name>_served`` composites may be
    promoted, and ground truth takes the best binary policy as the oracle. ``criterion``: how
    OPE on the select half picks the floor (:func:`select_by_ope`). ``mode``: ``"ledger"`` (default)
    decides through the ledger (:func:`ledger_gate` with ``ledger``; without it nothing is promoted),
    ``"per_night"`` by :func:`promotion_gate` on tonight's report half (valid for one night only)."""
    if mode not in GATE_MODES:
        raise ValueError(f"gate mode {mode!r}: use one of {', '.join(GATE_MODES)}")
    served = {f"{k}_served": distill_select_served(df, space, table, pol, k, ope_config=config,
                                                   criterion=criterion, progress=progress, behaviour=behaviour)
              for k, pol in trained.items()}
    policies = {STATIC: StaticTablePolicy(table, space)} | {f"{k}_trained": p for k, p in trained.items()} | {
        n: s.policy for n, s in served.items()}
    report = run_offline_eval(df_eval, policies, space, config, sim=sim, progress=progress, behaviour=behaviour,
                              oracle=sim.oracle_policy(space.mask) if sim is not None else None,
                              candidates=tuple(served),
                              gate=gate, evidence=df, no_interval=no_interval)
    if mode == "ledger":
        report = replace(report, gate=ledger_gate(report.gate, {n: s.policy for n, s in served.items()}, df, space,
                                                  table, ledger))
    return report, served


def plot_offline_eval(report: OfflineEvalReport) -> bytes:
    """Per policy: every episode-level and decision-level estimate with its 95% interval,
    ground truth marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows() if r["estimate"] is not None]
    policies = list(report.evaluations)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=False)
    if not rows:  # nothing to draw: say why on the figure instead of raising
        for ax in axes:
            ax.axis("off")
        axes[0].text(0.0, 0.5, "no estimates: " + (report.interval_reason or report.gate.reason), wrap=True,
                     fontsize=8, va="center")
        return artifacts.png_bytes(fig)
    for ax, scope, title in ((axes[0], "episode", "episode return"), (axes[1], "decision", "first-decision reward")):
        sub = [r for r in rows if r["scope"] == scope]
        ests = sorted({r["estimator"] for r in sub}, key=[r["estimator"] for r in sub].index)
        width = 0.8 / max(len(ests), 1)
        for j, est in enumerate(ests):
            xs, ys, lo, hi = [], [], [], []
            for i, p in enumerate(policies):
                r = next((r for r in sub if r["policy"] == p and r["estimator"] == est), None)
                if r:
                    xs.append(i + (j - (len(ests) - 1) / 2) * width)
                    ys.append(r["estimate"])
                    # no interval (too few sessions): the point alone; a percentile interval can exclude
                    # its own estimate (a ratio over few sessions): the bar then stops at the point
                    lo.append(0.0 if r["ci_low"] is None else max(r["estimate"] - r["ci_low"], 0.0))
                    hi.append(0.0 if r["ci_high"] is None else max(r["ci_high"] - r["estimate"], 0.0))
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=3, capsize=2, label=est)
        if report.truth is not None:
            truth = report.truth.episode_value if scope == "episode" else report.truth.first_step_value
            for i, p in enumerate(policies):
                ax.hlines(truth[p], i - 0.45, i + 0.45, colors="k", linestyles="--", lw=1)
            ax.axhline(truth["oracle"], color="tab:green", lw=0.8, ls=":", label="oracle (truth)")
        ax.set_xticks(range(len(policies)), policies, fontsize=8)
        ax.set_title(f"{title}: estimate, 95% CI; dashed = ground truth"
                     + (f"\nno intervals: {report.n_sessions} sessions, {report.min_sessions} needed"
                        if report.interval_reason else ""), fontsize=8)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return artifacts.png_bytes(fig)
