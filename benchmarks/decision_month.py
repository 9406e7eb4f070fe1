"""Decisions that hold for a month (issue 47): the decision ledger over simulated months of 30 nights, each
lever's wrong decisions, power, undo and cost, beside Wald's SPRT and today's per-night test.

The decision rule is the product's: ``sage_pipeline.decisions`` (``LedgerConfig()``'s defaults: alpha 0.05
per lever with candidate j accepted at ``alpha / (j (j + 1))``, the coder's at ``alpha 0.9 (0.1)^(j - 1)``
(``LedgerConfig.first_share``; the coder's bets the mixture over gains, ``LedgerConfig.coder_evidence``), when
K+(0) >= 1 / alpha_j, dropped when its
e-process against "gain >= min_useful_gain" (0.03) reaches 1 / drop_alpha or after 30 pending nights, reverted when its
probation stream's K-(0.03) >= 1 / 0.05). ``--engine ledger`` runs one :class:`Ledger` per month (batch 1,
``propose`` / ``add_evidence`` / ``decide`` as the nightly job calls them); ``--engine batch`` (the default,
see "Speed" in docs/benchmarks.md) runs the same rule on ``evidence.Stream``'s batch axis, every month's
candidates as rows: the same bets, the same thresholds computed by the same float operations, and the smoke
test checks that months decide identically both ways.

**Skills lever** (``skills``): SAGE's coder on tasks of the simulated coder world (``SimWorld('coder')``,
``--per-topic`` per topic, unit-test tasks only, drawn without replacement through the month: every day's
runs are new harvested tasks), answered by the whole-prompt stand-in (``sleep/harness/standin.py``, a test harness):
a run's pass is drawn with ``StandinModel.p_correct`` of the whole prompt ``sage_night.role_messages('coder',
tree, task)`` builds, ``tree`` SAGE's nine skills as shipped with the learned rules in the TDD skill's learned
block (SAGE injects it into every coder call). Each day ``N`` runs (40 or 20) are assigned by a recorded draw
of exact probability (``assign.make_plan`` thresholds): while a candidate is pending online (the pending one
with the largest K+(0) so far) ``candidate_share`` of the runs go to its tree, the rest to the live tree;
after an accept ``probation_share`` of the runs stay on the previous tree (split between the rules on
probation). Online evidence is the IPW contrast of the two arms' runs (``ipw_contrast``, the arms' exact
probabilities given the run was on one of them, centre the month's running mean pass). Each night the reflect
step is the stand-in's own reflect reply (``useless`` plausible rules, plus the planted instruction with
probability ``propose_planted`` unless it is live; at most ``propose_budget``); ``ledger.propose`` continues a
key it has seen. ``val_share`` of the day's tasks are tonight's val tasks (the rest the train tasks reflect
looked at, the proposals' ``selected_on``); every rule on probation and up to ``replay_candidates`` pending
ones (tonight's proposals first, then by evidence) are replayed on them: ``samples`` draws per arm per task
from ``p_correct`` (temperature > 0), the candidate's tree against the live tree (a rule on probation: the
live tree against the live tree without it), ``paired_difference`` per task.

- ``null``: the stand-in's ``effect='null'`` (the planted instruction proposed too, useless like the rest):
  months with any accept (wrong), useless rules live at the month's end;
- ``planted``: ``effect='planted'``, ``delta`` +0.15: the night the instruction is accepted, runs and replay
  calls from its first proposal to its accept, beside Wald's SPRT of H0 "no gain" vs H1 "+delta" on the same
  observations at the candidate's own alpha_j (beta ``sprt_beta``): Wald's approximation of E[N] (the
  observations' variances measured under H1, normal log-likelihood ratio) and the SPRT run night by night on
  the same per-night sums; and beside today's per-night test (``gate.sign_flip_p``'s exact one-sided
  sign-flip test of tonight's paired replays at ``GateConfig().alpha / EditLimits().edit_budget``, no
  carry-over; here an integer convolution of the same statistic, checked equal in the smoke test);
- ``drift``: ``planted`` whose stand-in's delta becomes ``drift_delta`` from night ``drift_night``: months with
  the rule live at the start of that night whose rule is reverted within 7 nights.

**Coder lever** (``coder``): the model world's exact truth (``sage_world.world.build_world`` over
``--world-tasks`` generated tasks with SAGE's shipped models.yaml, no SAGE needed; cached in
``benchmarks/.scratch``): per task the exact verified chance and expected GPU-seconds of a ``sage run`` with
the coder pinned to qwen2.5-coder:1.5b (SAGE's primary, the incumbent) or :14b (the candidate), every other
role by SAGE's YAML (task_complexity_score 0.5). A run draws a task, its arm (pending: 50/50; pinned:
``1 - coder_explore`` on the pin), its verified outcome; ``y`` is task_v1 (verified - GPU-seconds / 3600)
rescaled to [0, 1] by the bounds [-gpu_seconds_max / 3600, 1]; the contrast's centre is the running mean of the
earlier runs before each run, after a prior of one run at 0.5, as ``coder.add_runs`` keeps it (``--coder-centre
day``: the earlier days' mean for a whole day, 0.5 on the first, as this benchmark had it before 2026-12-02 18:00:
the first night's contrast then has variance ~0.98 instead of ~0.27, and the plug-in's bets stay small for
nights). The month simulates the lever's first candidate only (the preferred model, at alpha_1); ``--coder-bet``
and ``--coder-first-share`` set the coder's bets and level. ``null``: both arms the 1.5b; ``gap``: the
14b; ``drift``: the 14b until night ``drift_night``, then its verified chance the 1.5b's minus ``coder_drop``.

**Router lever** (``router``, null only): each night a new tied checkpoint is proposed; each episode's one
routing decision differs from the deployed policy's with probability ``router_differ`` per candidate, and the
deployed checkpoint explores (takes the other model) with probability ``router_explore``: the contrast is the
per-episode IPW one with weights bounded by 1 / ``router_explore``; the outcome is the world's task_v1 draw,
the same law under both models. Months with any promotion (all wrong).

Intervals: Clopper-Pearson 95% for shares, mean +- 1.96 standard errors for means, a percentile bootstrap
over months (2,000 resamples) for ratios. Results: printed, and written to ``--out``.

    .venv/bin/python benchmarks/decision_month.py [--months 200] [--engine batch|ledger] [--workers 2] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _cli import count  # benchmarks/ is the script's folder: first on sys.path

from sage_pipeline.decisions import assign, evidence as ev
from sage_pipeline.decisions.ledger import Ledger, LedgerConfig, LedgerError, LedgerFile

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "benchmarks" / ".scratch"
TDD = "discipline/test-driven-development/SKILL.md"
SCENARIOS = ("skills/null/40", "skills/null/20", "skills/planted/40", "skills/planted/20", "skills/drift/40",
             "coder/null/60", "coder/gap/60", "coder/drift/60", "router/null/60")
INCUMBENT, CHALLENGER = "qwen2.5-coder:1.5b", "qwen2.5-coder:14b-instruct-q4_K_M"


@dataclass(frozen=True)
class Settings:
    """Every number the months run with (the command line sets them)."""

    months: int = 200
    nights: int = 30
    seed: int = 0
    engine: str = "batch"  # "ledger": one Ledger per month; "batch": the same rule on Stream's batch axis
    chunk: int = 50  # months run side by side by the batch engine
    # the skills lever
    per_topic: int = 200  # the coder world's tasks per topic (11 topics; ~1,400 unit-test tasks)
    val_share: float = 0.65  # of a day's tasks replayed at night (26 of 40, 13 of 20); the rest: reflect's train
    samples: int = 16  # replays per val task and arm (temperature > 0)
    replay_candidates: int = 5  # pending candidates replayed a night (every rule on probation besides)
    propose_budget: int = 3  # reflect's edits a night at most
    useless: int = 2  # useless rules in each reflect reply
    propose_planted: float = 0.7  # chance a reply proposes the planted instruction (when not live)
    delta: float = 0.15  # the planted instruction's effect on P(correct)
    candidate_share: float = 0.5  # runs on the pending candidate online (of those not on probation arms)
    probation_share: float = 0.1  # runs kept on the previous tree after an accept
    drift_night: int = 15
    drift_delta: float = -0.15
    # the coder lever
    world_tasks: int = 300
    coder_explore: float = 0.3  # runs kept on the other model after a pin (0.1 reverted a bad pin within 7 nights
    # in 37% of months, 0.3 in 87%: the stated exploration share of a pinned coder)
    coder_drop: float = 0.15  # drift: the pinned model's verified chance falls this far below the other's
    gpu_seconds_max: float = 120.0  # the rescaling bound of task_v1's time term
    complexity: float = 0.5
    # the router lever
    router_explore: float = 0.1
    router_differ: float = 0.5
    # the decision rule's settings (LedgerConfig's defaults unless a flag changes them)
    cap: float = ev.EvidenceConfig().cap  # the largest bet, as a share of the largest safe one
    probation_half_life: float = 60.0
    coder_first_takes_all: bool = False  # the coder lever's one candidate at alpha, not alpha * first_share
    coder_bet: str = LedgerConfig().coder_evidence.bet  # LedgerConfig().coder_evidence.bet unless --coder-bet
    skills_online_bet: str = LedgerConfig().online_evidence.bet  # LedgerConfig().online_evidence.bet unless
    # --skills-online-bet (plug_in: the skills runs bet as the replays do, with evidence, as before schema 4)
    coder_first_share: float | None = None  # LedgerConfig().first_share["coder"] unless --coder-first-share
    coder_centre: str = "run"  # "run": the running mean before each run (coder.add_runs); "day": fixed for a day
    # the comparisons
    sprt_beta: float = 0.2
    bootstrap: int = 2000

    def runs(self, scenario: str) -> int:
        return int(scenario.rsplit("/", 1)[1])


# =============================================================================================== statistics
def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    if n == 0:
        return (float("nan"), float("nan"))
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def share(flags: Sequence[bool]) -> dict:
    k, n = int(sum(bool(f) for f in flags)), len(flags)
    lo, hi = clopper_pearson(k, n)
    return {"k": k, "n": n, "value": k / n if n else float("nan"), "ci": [lo, hi], "kind": "share"}


def mean(xs: Sequence[float]) -> dict:
    a = np.asarray([x for x in xs if x is not None and np.isfinite(x)], dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "value": float("nan"), "ci": [float("nan"), float("nan")], "kind": "mean"}
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float("nan")
    m = float(a.mean())
    return {"n": int(a.size), "value": m, "ci": [m - 1.96 * se, m + 1.96 * se], "kind": "mean"}


def ratio(num: Sequence[float], den: Sequence[float], seed: int, resamples: int) -> dict:
    """mean(num) / mean(den) over the months both are defined in, with a percentile bootstrap interval."""
    pairs = np.array([(a, b) for a, b in zip(num, den, strict=True) if a is not None and b is not None
                      and np.isfinite(a) and np.isfinite(b)], dtype=np.float64).reshape(-1, 2)
    if len(pairs) == 0 or pairs[:, 1].mean() <= 0:
        return {"n": 0, "value": float("nan"), "ci": [float("nan"), float("nan")], "kind": "ratio"}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pairs), size=(resamples, len(pairs)))
    boot = pairs[idx, 0].mean(axis=1) / pairs[idx, 1].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"n": int(len(pairs)), "value": float(pairs[:, 0].mean() / pairs[:, 1].mean()),
            "ci": [float(lo), float(hi)], "kind": "ratio"}


def sign_flip_p(d: np.ndarray, samples: int) -> float:
    """The one-sided exact sign-flip p-value of ``sum(d) > 0`` (``gate.sign_flip_p``'s exact branch) for
    per-task mean differences of ``samples`` binary replays per arm: each |d| is an integer over
    ``samples``, so the null distribution of the integer sum is a convolution of two-point laws."""
    m = np.rint(np.abs(d) * samples).astype(np.int64)
    s = int(np.rint(np.sum(d) * samples))
    m = m[m > 0]
    if m.size == 0:
        return 1.0
    total = int(m.sum())
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for v in m.tolist():
        dist = 0.5 * (np.roll(dist, v) + np.roll(dist, -v))  # the support never wraps: |sum| <= total
    return float(min(1.0, dist[total + s:].sum()))


def wald_sprt_n(alpha: float, beta: float, kl: float) -> float:
    """Wald's approximation of E[N] under H1 of the SPRT with errors (alpha, beta), ``kl`` the per-observation
    Kullback-Leibler information E_1[log LR]."""
    a, b = math.log((1 - beta) / alpha), math.log(beta / (1 - alpha))
    return ((1 - beta) * a + beta * b) / kl


# =============================================================================================== the rule
class LedgerEngine:
    """One :class:`Ledger` per month (batch 1): the product's own calls. Evidence added during a night is fed
    when the night decides (as the nightly job does: add everything, then decide)."""

    name = "ledger"

    def __init__(self, months: int, lever: str, config: LedgerConfig) -> None:
        self.lever, self.cfg = lever, config
        self.ledgers = [Ledger(LedgerFile(config=config)) for _ in range(months)]
        self.nulls = config.nulls()
        self.i0 = ev.at(self.nulls, 0.0)
        self.buffer: list[tuple] = []

    def propose(self, m: int, key: str, night: str, selected_on: Sequence[str] = ()) -> tuple[str, bool]:
        c, new = self.ledgers[m].propose(self.lever, key, night=night, selected_on=selected_on)
        return c.id, new

    def state(self, m: int, cid: str) -> str:
        return self.ledgers[m].get(cid).state

    def index(self, m: int, cid: str) -> int:
        return self.ledgers[m].get(cid).index

    def alpha(self, m: int, cid: str) -> float:
        return self.ledgers[m].get(cid).alpha

    def log_evidence(self, m: int, cid: str, stream: str | None = None) -> float:
        """log K+(0) of the candidate's streams (one stream: ``stream``), 0 before any evidence."""
        led = self.ledgers[m]
        c = led.get(cid)
        names = [n for n in c.streams if stream is None or n == stream]
        if not names:
            return 0.0
        lp, _ = ev.combined([led._stream(c, "streams", n) for n in names])
        return float(lp[0, self.i0])

    def log_revert(self, m: int, cid: str, stream: str) -> float:
        """log K-(min_useful_gain) of the candidate's probation stream ``stream``, 0 before any."""
        led = self.ledgers[m]
        c = led.get(cid)
        if stream not in c.probation:
            return 0.0
        return float(led._stream(c, "probation", stream).log_minus[0, ev.at(self.nulls, self.cfg.min_useful_gain)])

    def add(self, m: int, cid: str, stream: str, x, lo, hi, units: Sequence[str]) -> None:
        self.buffer.append((m, cid, stream, x, lo, hi, list(units)))

    def decide(self, night: str) -> list[tuple[int, str, str]]:
        for m, cid, stream, x, lo, hi, units in self.buffer:
            self.ledgers[m].add_evidence(cid, stream, x, lo, hi, units)
        self.buffer = []
        out = []
        for m, led in enumerate(self.ledgers):
            for c in list(led.data.candidates):
                if c.state in ("pending", "accepted"):
                    new = led.decide(c.id, night)
                    if new:
                        out.append((m, c.id, new))
        return out


_FIELDS = ("log_plus", "log_minus", "w", "s1", "s2", "n", "total")


def _fields(s: ev.Stream) -> tuple[str, ...]:
    return _FIELDS + (("comp_plus", "comp_minus") if s.comp_plus is not None else ())


def _take(s: ev.Stream, rows: np.ndarray) -> ev.Stream:
    sub = ev.Stream(s.nulls, *(getattr(s, f)[rows] for f in _FIELDS))
    if s.comp_plus is not None:
        sub.comp_plus, sub.comp_minus = s.comp_plus[rows], s.comp_minus[rows]
    return sub


def _put(s: ev.Stream, rows: np.ndarray, sub: ev.Stream) -> None:
    for f in _fields(s):
        getattr(s, f)[rows] = getattr(sub, f)


def _grown(s: ev.Stream, capacity: int) -> ev.Stream:
    fresh = ev.Stream.start(s.nulls, capacity, s.components())
    rows = np.arange(s.w.shape[0])
    _put(fresh, rows, s)
    return fresh


class BatchEngine:
    """:meth:`Ledger.add_evidence` and :meth:`Ledger.decide` for every month's candidates at once: each
    candidate a row of an ``evidence.Stream`` per stream name (its main streams, and its probation streams
    from its accept on, with ``probation_half_life``), fed observation by observation on the batch axis (rows
    without an observation at a step are masked, as ``Stream.update`` allows). The decisions are the
    ledger's, in the same order and with the same float operations: accept when
    ``exp(min(log K+(0), 700)) >= 1 / alpha_j``, else drop when
    ``exp(min(log K-(min_useful_gain), 700)) >= 1 / drop_alpha`` or after ``max_pending_nights``; an
    accepted row with probation evidence is reverted when
    ``exp(min(log K-(min_useful_gain), 700)) >= 1 / revert_alpha``. No units are checked here
    (the ledger engine does, on the same simulation)."""

    name = "batch"
    STREAMS = ("online", "replay")

    def __init__(self, months: int, lever: str, config: LedgerConfig, capacity: int = 256) -> None:
        self.lever, self.cfg = lever, config
        self.nulls = config.nulls()
        self.i0, self.imin = ev.at(self.nulls, 0.0), ev.at(self.nulls, config.min_useful_gain)
        self.slow = {s: config.evidence_for(lever, s) for s in self.STREAMS}  # each stream's bets, as the ledger's
        self.fast = config.probation_evidence(lever)
        self.main = {s: ev.Stream.start(self.nulls, capacity, self.slow[s].components()) for s in self.STREAMS}
        self.prob = {s: ev.Stream.start(self.nulls, capacity, self.fast.components()) for s in self.STREAMS}
        self.month: list[int] = []
        self.idx: list[int] = []
        self.alphas: list[float] = []
        self.states: list[str] = []
        self.nights: list[int] = []
        self.present: list[list[str]] = []  # main streams fed, in the order they were first fed
        self.prob_present: list[list[str]] = []
        self.keys: list[dict[str, int]] = [{} for _ in range(months)]
        self.next_index = [1] * months
        self.buffer: list[tuple] = []

    def propose(self, m: int, key: str, night: str, selected_on: Sequence[str] = ()) -> tuple[int, bool]:
        row = self.keys[m].get(key)
        if row is not None:
            return row, False
        j = self.next_index[m]
        self.next_index[m] = j + 1
        row = len(self.month)
        cap = self.main["online"].w.shape[0]
        if row >= cap:
            for d in (self.main, self.prob):
                for s in d:
                    d[s] = _grown(d[s], 2 * cap)
        self.month.append(m)
        self.idx.append(j)
        self.alphas.append(self.cfg.alpha_for(j, self.lever))
        self.states.append("pending")
        self.nights.append(0)
        self.present.append([])
        self.prob_present.append([])
        self.keys[m][key] = row
        return row, True

    def state(self, m: int, cid: int) -> str:
        return self.states[cid]

    def index(self, m: int, cid: int) -> int:
        return self.idx[cid]

    def alpha(self, m: int, cid: int) -> float:
        return self.alphas[cid]

    def log_evidence(self, m: int, cid: int, stream: str | None = None) -> float:
        names = [n for n in self.present[cid] if stream is None or n == stream]
        if not names:
            return 0.0
        return float(sum(self.main[n].log_plus[cid:cid + 1] for n in names)[0, self.i0])

    def log_revert(self, m: int, cid: int, stream: str) -> float:
        return float(self.prob[stream].log_minus[cid, self.imin]) if stream in self.prob_present[cid] else 0.0

    def add(self, m: int, cid: int, stream: str, x, lo, hi, units: Sequence[str]) -> None:
        x = np.asarray(x, dtype=np.float64).ravel()
        if len(x):
            self.buffer.append((cid, stream, x, np.broadcast_to(np.asarray(lo, dtype=np.float64), x.shape),
                                np.broadcast_to(np.asarray(hi, dtype=np.float64), x.shape)))

    @staticmethod
    def _feed(stream: ev.Stream, seqs: dict[int, list[tuple]], cfg: ev.EvidenceConfig) -> None:
        rows = np.array(sorted(seqs), dtype=np.int64)
        parts = [[np.concatenate([p[i] for p in seqs[r]]) for i in range(3)] for r in rows.tolist()]
        L = max(len(p[0]) for p in parts)
        X, LO, HI = np.zeros((len(rows), L)), np.full((len(rows), L), -1.0), np.ones((len(rows), L))
        V = np.zeros((len(rows), L), dtype=bool)
        for k, (x, lo, hi) in enumerate(parts):
            X[k, :len(x)], LO[k, :len(x)], HI[k, :len(x)], V[k, :len(x)] = x, lo, hi, True
        sub = _take(stream, rows)
        for t in range(L):
            sub.update(X[:, t], LO[:, t], HI[:, t], cfg, valid=V[:, t])
        _put(stream, rows, sub)

    def _flush(self) -> None:
        main: dict[str, dict[int, list]] = {s: {} for s in self.STREAMS}
        prob: dict[str, dict[int, list]] = {s: {} for s in self.STREAMS}
        for cid, stream, x, lo, hi in self.buffer:
            main[stream].setdefault(cid, []).append((x, lo, hi))
            if stream not in self.present[cid]:
                self.present[cid].append(stream)
            if self.states[cid] == "accepted":
                prob[stream].setdefault(cid, []).append((x, lo, hi))
                if stream not in self.prob_present[cid]:
                    self.prob_present[cid].append(stream)
        self.buffer = []
        for s in self.STREAMS:
            if main[s]:
                self._feed(self.main[s], main[s], self.slow[s])
            if prob[s]:
                self._feed(self.prob[s], prob[s], self.fast)

    def _combined(self, rows: np.ndarray, which: dict, present: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        lp = np.zeros((len(rows), len(self.nulls)))
        lm = np.zeros_like(lp)
        for s in self.STREAMS:  # a stream a row was never fed adds 0.0: x + 0.0 == x
            has = np.array([s in present[r] for r in rows.tolist()], dtype=bool)
            if has.any():
                lp[has] = lp[has] + which[s].log_plus[rows[has]]
                lm[has] = lm[has] + which[s].log_minus[rows[has]]
        return lp, lm

    def decide(self, night: str) -> list[tuple[int, int, str]]:
        self._flush()
        cfg = self.cfg
        out = []
        pend = np.array([r for r, s in enumerate(self.states) if s == "pending"], dtype=np.int64)
        if len(pend):
            lp, lm = self._combined(pend, self.main, self.present)
            for k, r in enumerate(pend.tolist()):
                self.nights[r] += 1
                new = None
                if self.present[r] and math.exp(min(lp[k, self.i0], 700)) >= 1.0 / self.alphas[r]:
                    new = "accepted"
                elif self.present[r] and math.exp(min(lm[k, self.imin], 700)) >= 1.0 / cfg.drop_alpha:
                    new = "dropped"
                elif self.nights[r] >= cfg.max_pending_nights:
                    new = "dropped"
                if new:
                    out.append((r, new))
        acc = np.array([r for r, s in enumerate(self.states) if s == "accepted" and self.prob_present[r]],
                       dtype=np.int64)
        if len(acc):
            _, lm = self._combined(acc, self.prob, self.prob_present)
            for k, r in enumerate(acc.tolist()):
                if math.exp(min(lm[k, self.imin], 700)) >= 1.0 / cfg.revert_alpha:
                    out.append((r, "reverted"))
        for r, new in out:
            self.states[r] = new
            if new == "accepted":  # probation starts now, on new observations only
                self.prob_present[r] = []
                for s in self.STREAMS:
                    _put(self.prob[s], np.array([r]), ev.Stream.start(self.nulls, 1, self.fast.components()))
        out.sort(key=lambda t: (self.month[t[0]], self.idx[t[0]]))
        return [(self.month[r], r, new) for r, new in out]


class FirstTakesAll(LedgerConfig):
    """``--coder-first-takes-all``: the lever's first candidate is accepted at ``alpha`` itself (gamma_1 = 1),
    valid only for a lever that never proposes a second one (the coder's other model); a second is refused."""

    def alpha_for(self, index: int, lever: str | None = None) -> float:
        if index != 1:
            raise LedgerError("FirstTakesAll spends the whole level on the first candidate: there is no second")
        return self.alpha


def ledger_config(S: Settings, lever: str) -> LedgerConfig:
    changed = {}
    if S.cap != ev.EvidenceConfig().cap:
        changed["evidence"] = ev.EvidenceConfig(cap=S.cap)
    if S.skills_online_bet != LedgerConfig().online_evidence.bet:  # plug_in: the runs bet as the replays
        changed["online_evidence"] = changed.get("evidence", ev.EvidenceConfig())
    elif S.cap != ev.EvidenceConfig().cap:
        changed["online_evidence"] = LedgerConfig().online_evidence.model_copy(update={"cap": S.cap})
    if lever == "coder":
        changed["coder_evidence"] = LedgerConfig().coder_evidence.model_copy(update={"bet": S.coder_bet, "cap": S.cap})
        if S.coder_first_share is not None:
            changed["first_share"] = {"coder": S.coder_first_share}
    if S.probation_half_life != LedgerConfig().probation_half_life:
        changed["probation_half_life"] = S.probation_half_life
    cls = FirstTakesAll if lever == "coder" and S.coder_first_takes_all else LedgerConfig
    return cls(**changed)


def make_engine(S: Settings, months: int, lever: str):
    return (LedgerEngine if S.engine == "ledger" else BatchEngine)(months, lever, ledger_config(S, lever))


def draw_arms(plan: assign.Plan, lever: str, u: np.ndarray) -> np.ndarray:
    """Each run's arm index for its 32-bit uniform ``u`` (``assign.draw``'s rule: the first arm whose
    cumulative threshold exceeds it), vectorised."""
    cum = np.cumsum([a.threshold for a in plan.levers[lever]])
    return np.searchsorted(cum, u, side="right")


def night_name(n: int) -> str:
    return f"night-{n:02d}"


# =============================================================================================== skills
class SkillsWorld:
    """What every skills month shares: the task pool and SAGE's tree as shipped."""

    def __init__(self, S: Settings) -> None:
        from sage_pipeline.sage import skills as sk
        from sage_pipeline.sleep.block import parse_document
        from sage_pipeline.sleep.harness.sim_world import SimWorld
        from sage_pipeline.sleep.records import SplitSpec

        world = SimWorld.load("coder")
        self.pool = [t for t in world.generate_tasks(2026, per_topic=S.per_topic, split=SplitSpec(train=0.5, val=0.25),
                                                     prefix="month") if t.reference_kind == "unit_tests"]
        self.base = {sid: sk.read_skill(sk.SKILL_TREE / sid) for sid in sk.SKILL_IDS}
        self.doc = parse_document(self.base[TDD], TDD)


class SkillsMonth:
    """One month of the skills lever (see the module doc); ``i`` its row in the engine."""

    def __init__(self, S: Settings, scenario: str, m: int, i: int, world: SkillsWorld, code: int) -> None:
        from sage_pipeline.sleep.harness.standin import StandinConfig, StandinModel

        self.S, self.i, self.world = S, i, world
        _, self.kind, _ = scenario.split("/")
        self.N = S.runs(scenario)
        self.rng = np.random.default_rng([S.seed, code, m])
        effect = "null" if self.kind == "null" else "planted"
        cfg = StandinConfig(seed=int(self.rng.integers(2 ** 31)), effect=effect, delta=S.delta,
                            propose_planted=S.propose_planted, useless=S.useless)
        self.models = [StandinModel([], cfg)]  # p_correct needs no task list; reflect none either
        if self.kind == "drift":
            self.models.append(StandinModel([], cfg.model_copy(update={"delta": S.drift_delta})))
        need = S.nights * self.N
        take = self.rng.choice(len(world.pool), need, replace=need > len(world.pool))
        self.tasks = [world.pool[k] for k in take]
        self.live: list[str] = []  # the learned block's rules, in order
        self.cands: dict = {}  # cid -> {"rule", "planted", "proposed", ...}
        self.p_cache: dict = {}
        self.trees: dict = {}
        self.y_sum, self.y_n = 0.0, 0
        self.acc = {"runs": 0, "on_candidate": 0, "on_previous": 0, "cost_candidate": 0.0, "cost_previous": 0.0,
                    "replay_calls": 0,
                    "today_wrong": [], "candidates": 0, "p_evals": 0}
        self.planted: dict = {"cid": None, "first": None, "accepted": None, "reverted": None, "rows": [],
                              "today_first": None, "online_obs": 0, "replay_tasks": 0, "replay_calls": 0}

    # ---- the truth
    def phase(self, n: int) -> int:
        return 1 if self.kind == "drift" and n >= self.S.drift_night else 0

    def tree(self, rules: tuple[str, ...]) -> dict[str, str]:
        t = self.trees.get(rules)
        if t is None:
            t = self.trees[rules] = {**self.world.base, TDD: self.world.doc.render(rules)}
        return t

    def p(self, task, rules: tuple[str, ...], n: int) -> float:
        from sage_pipeline.sleep.sage_night import role_messages

        key = (rules, task.id, self.phase(n))
        v = self.p_cache.get(key)
        if v is None:
            self.acc["p_evals"] += 1
            v = self.p_cache[key] = self.models[self.phase(n)].p_correct(task, role_messages("coder", self.tree(rules),
                                                                                             task))
        return v

    def _is_planted(self, rule: str) -> bool:
        return self.models[0].has_instruction(rule)

    # ---- a day of runs
    def day(self, n: int, eng) -> None:
        S, N = self.S, self.N
        tasks = self.tasks[(n - 1) * N:n * N]
        live = tuple(self.live)
        probation = [c for c in self.cands if eng.state(self.i, c) == "accepted"]
        pending = [c for c in self.cands if eng.state(self.i, c) == "pending"]
        online = max(pending, key=lambda c: (eng.log_evidence(self.i, c), -eng.index(self.i, c))) if pending else None
        arms = []  # (name, cid, probability, rules)
        rest = 1.0
        if probation:
            for c in probation:
                rule = self.cands[c]["rule"]
                arms.append((f"prev-{eng.index(self.i, c)}", c, S.probation_share / len(probation),
                             tuple(r for r in live if r != rule)))
            rest -= S.probation_share
        if online is not None:
            arms.append(("candidate", online, rest * S.candidate_share, live + (self.cands[online]["rule"],)))
            rest -= rest * S.candidate_share
        arms.insert(0, ("live", None, rest, live))
        plan = assign.make_plan({"skills": [(a[0], None if a[1] is None else str(a[1]), a[2], {}) for a in arms]})
        probs = np.array([a.probability for a in plan.levers["skills"]])
        arm = draw_arms(plan, "skills", self.rng.integers(0, assign.SCALE, size=N, dtype=np.int64))
        p = np.array([self.p(t, arms[a][3], n) for t, a in zip(tasks, arm.tolist(), strict=True)])
        y = (self.rng.random(N) < p).astype(np.float64)
        centre = self.y_sum / self.y_n if self.y_n else 0.5
        units = [f"d{n}-r{j}" for j in range(N)]
        self.acc["runs"] += N
        for j, a in enumerate(arm.tolist()):
            if a:
                which = "candidate" if arms[a][0] == "candidate" else "previous"
                self.acc[f"on_{which}"] += 1
                self.acc[f"cost_{which}"] += self.p(tasks[j], live, n) - p[j]
        for a in range(1, len(arms)):
            cid = arms[a][1]
            on = (arm == a) | (arm == 0)
            if not on.any():
                continue
            pa, pb = probs[a] / (probs[a] + probs[0]), probs[0] / (probs[a] + probs[0])
            if arms[a][0] == "candidate":  # candidate vs live
                x, lo, hi = ev.ipw_contrast(y[on], arm[on] == a, arm[on] == 0, pa, pb, centre)
            else:  # on probation: live (with the rule) vs the previous tree (without it)
                x, lo, hi = ev.ipw_contrast(y[on], arm[on] == 0, arm[on] == a, pb, pa, centre)
            eng.add(self.i, cid, "online", x, lo, hi, [u for u, o in zip(units, on.tolist(), strict=True) if o])
            if cid == self.planted["cid"] and eng.state(self.i, cid) == "pending":
                self._row(n)["on"] += x.tolist()
        self.y_sum += float(y.sum())
        self.y_n += N

    def _row(self, n: int) -> dict:
        rows = self.planted["rows"]
        if not rows or rows[-1]["night"] != n:
            rows.append({"night": n, "on": [], "rep": []})
        return rows[-1]

    # ---- the night: reflect, replay
    def night(self, n: int, eng) -> None:
        from sage_pipeline.sage import skills as sk
        from sage_pipeline.sleep.block import normalise_rule
        from sage_pipeline.sleep.harness.standin import REFLECT_SYSTEM

        S, N = self.S, self.N
        tasks = self.tasks[(n - 1) * N:n * N]
        order = self.rng.permutation(N)
        n_val = int(round(S.val_share * N))
        val_at = sorted(order[:n_val].tolist())
        val = [tasks[k] for k in val_at]
        # a unit is the day's k-th run's task (a small pool may draw one task twice in a day)
        train_ids = [f"d{n}-t{k}:{tasks[k].id}" for k in sorted(order[n_val:].tolist())]
        live = tuple(self.live)
        docs = self.tree(live)[TDD]
        system = (f"{REFLECT_SYSTEM} (SAGE's coder: the skills SAGE injects into its prompt). Targets you may edit: "
                  f"skill. Propose at most {S.propose_budget} edits. Reply with JSON only.")
        reply = self.models[0].chat({"messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": docs}], "temperature": 0.7})
        tonight = []
        for e in json.loads(reply)["edits"]:
            rule = " ".join(str(e["content"]).split())
            if normalise_rule(rule) in {normalise_rule(r) for r in live}:
                continue  # the block refuses a duplicate
            try:
                sk.check_text(TDD, self.tree(live + (rule,))[TDD])
            except sk.SkillsError:
                continue  # SAGE would not inject it whole: the night refuses it (over_sage_cap)
            cid, new = eng.propose(self.i, f"{TDD}::{normalise_rule(rule)}", night_name(n), train_ids)
            if new:
                self.acc["candidates"] += 1
                self.cands[cid] = {"rule": rule, "planted": self._is_planted(rule), "proposed": n}
                if self.cands[cid]["planted"]:
                    self.planted.update(cid=cid, first=n, index=eng.index(self.i, cid), alpha=eng.alpha(self.i, cid))
            if eng.state(self.i, cid) == "pending" and cid not in tonight:
                tonight.append(cid)
        pending = [c for c in self.cands if eng.state(self.i, c) == "pending"]
        rest = sorted((c for c in pending if c not in tonight),
                      key=lambda c: (-eng.log_evidence(self.i, c), eng.index(self.i, c)))
        replay = (tonight + rest)[:S.replay_candidates]
        probation = [c for c in self.cands if eng.state(self.i, c) == "accepted"]
        k = S.samples
        units = [f"d{n}-t{j}:{tasks[j].id}" for j in val_at]
        base = self.rng.binomial(k, [self.p(t, live, n) for t in val]) / k
        self.acc["replay_calls"] += k * len(val) * (1 + len(replay) + len(probation))
        level = 0.05 / 4  # GateConfig().alpha / EditLimits().edit_budget (checked in the smoke test)
        for cid in replay:
            rules = live + (self.cands[cid]["rule"],)
            cand = self.rng.binomial(k, [self.p(t, rules, n) for t in val]) / k
            x, lo, hi = ev.paired_difference(cand, base)
            eng.add(self.i, cid, "replay", x, lo, hi, units)
            planted = self.cands[cid]["planted"] and self.kind != "null"
            if cid in tonight:  # today's per-night test of tonight's proposals, on the same replays
                passed = float(np.mean(x)) > 1e-9 and sign_flip_p(x, k) <= level
                if passed and not planted:
                    self.acc["today_wrong"].append(n)
                if passed and planted and self.planted["today_first"] is None:
                    self.planted["today_first"] = n
            if cid == self.planted["cid"] and eng.state(self.i, cid) == "pending":
                self._row(n)["rep"] += x.tolist()
                self.planted["replay_tasks"] += len(val)
                self.planted["replay_calls"] += 2 * k * len(val)
        for cid in probation:
            rule = self.cands[cid]["rule"]
            prev = self.rng.binomial(k, [self.p(t, tuple(r for r in live if r != rule), n) for t in val]) / k
            x, lo, hi = ev.paired_difference(base, prev)
            eng.add(self.i, cid, "replay", x, lo, hi, units)
            # today's test had no carry-over and no probation: a rule it had not kept yet would be proposed again
            # (the stand-in's propose_planted a night) and tested on tonight's paired replays of that very rule
            if (cid == self.planted["cid"] and self.kind != "null" and self.planted["today_first"] is None
                    and self.rng.random() < S.propose_planted and float(np.mean(x)) > 1e-9
                    and sign_flip_p(x, k) <= level):
                self.planted["today_first"] = n
        if self.planted["cid"] is not None and eng.state(self.i, self.planted["cid"]) == "pending":
            self._row(n)  # a night it was pending counts for the SPRT too, whatever it was shown
            self.planted["online_obs"] += sum(len(r["on"]) for r in self.planted["rows"] if r["night"] == n)

    def apply(self, n: int, cid, new: str, eng) -> None:
        c = self.cands[cid]
        if new == "accepted":
            self.live.append(c["rule"])
            c["accepted"] = n
            if cid == self.planted["cid"]:
                self.planted["accepted"] = n
                self.planted["online_log"] = eng.log_evidence(self.i, cid, "online")
                self.planted["replay_log"] = eng.log_evidence(self.i, cid, "replay")
        elif new == "reverted":
            self.live.remove(c["rule"])
            c["reverted"] = n
            if cid == self.planted["cid"]:
                self.planted["reverted"] = n
                self.planted["revert_online_log"] = eng.log_revert(self.i, cid, "online")
                self.planted["revert_replay_log"] = eng.log_revert(self.i, cid, "replay")
        elif new == "dropped":
            c["dropped"] = n

    def after(self, n: int, eng) -> None:
        """After the night's decisions: the planted rule's evidence stream by stream (each stream's bets read
        only its own past, so one stream alone is the e-process a design without the other would have)."""
        cid = self.planted["cid"]
        if cid is None or eng.state(self.i, cid) not in ("pending", "accepted"):
            return
        self.planted.setdefault("by_stream", []).append({
            "night": n, "state": eng.state(self.i, cid),
            "online": eng.log_evidence(self.i, cid, "online"), "replay": eng.log_evidence(self.i, cid, "replay")})

    def result(self) -> dict:
        planted_live = any(self._is_planted(r) for r in self.live)
        wrong = [c for c in self.cands.values() if "accepted" in c and not (c["planted"] and self.kind != "null")]
        a = self.acc
        pl = dict(self.planted)
        if pl["first"] is not None and pl["accepted"] is not None:
            pl["nights_to_keep"] = pl["accepted"] - pl["first"] + 1
        return {"wrong_accepts": len(wrong), "wrong_accept_nights": [c["accepted"] for c in wrong],
                "useless_live_end": sum(1 for r in self.live if not (self._is_planted(r) and self.kind != "null")),
                "planted_live_end": planted_live and self.kind != "null",
                "reverted": sum(1 for c in self.cands.values() if "reverted" in c),
                "dropped": sum(1 for c in self.cands.values() if "dropped" in c),
                "pending_end": sum(1 for c in self.cands.values() if not ({"accepted", "dropped"} & set(c))),
                "planted": pl, **a}


# =============================================================================================== coder
def coder_world(S: Settings, log) -> dict:
    """Per task of the model world, the exact verified chance and expected GPU-seconds of a sage run with the
    coder pinned to each model (cached)."""
    path = SCRATCH / f"decision_month_world_{S.world_tasks}_{S.complexity:g}.json"
    if path.exists():
        return json.loads(path.read_text())
    from sage_pipeline import artifacts
    from sage_pipeline.sage.table import pin
    from sage_pipeline.sage_world import truth as T
    from sage_pipeline.sage_world.world import build_world

    t0 = time.perf_counter()
    world = build_world(ROOT / "sage_pipeline" / "sage" / "data" / "models.yaml", n_tasks=S.world_tasks, progress=log)
    out = {"tasks": [t.task_id for t in world.tasks], "rows": {"coder": list(world.row("coder"))}}
    for m in (INCUMBENT, CHALLENGER):
        runs = [{"task_id": t.task_id, "coder_model": m, "complexity": S.complexity} for t in world.tasks]
        vals = T.run_values(world, runs, T.SagePolicy(pin(world.table, "coder", m)))
        out[m] = {"verified": vals[:, 1].tolist(), "gpu_seconds": vals[:, 3].tolist(), "usd": vals[:, 4].tolist()}
    out["seconds"] = time.perf_counter() - t0
    artifacts.write_json(path, out)
    log(f"coder world: {len(world.tasks)} tasks valued in {out['seconds']:.0f} s -> {path}")
    return out


def rescale(S: Settings, verified, gpu_seconds):
    """task_v1 (verified - GPU-seconds / 3600) rescaled to [0, 1] by the bounds [-gpu_seconds_max / 3600, 1]."""
    w = 1.0 / 3600.0
    lo = -w * S.gpu_seconds_max
    return (np.asarray(verified, dtype=np.float64) - w * np.asarray(gpu_seconds) - lo) / (1.0 - lo)


class CoderMonth:
    def __init__(self, S: Settings, scenario: str, m: int, i: int, world: dict, code: int) -> None:
        self.S, self.i = S, i
        _, self.kind, _ = scenario.split("/")
        self.N = S.runs(scenario)
        self.rng = np.random.default_rng([S.seed, code, m])
        self.pv_inc = np.array(world[INCUMBENT]["verified"])
        self.g_inc = np.array(world[INCUMBENT]["gpu_seconds"])
        other = INCUMBENT if self.kind == "null" else CHALLENGER
        self.pv_cand = np.array(world[other]["verified"])
        self.g_cand = np.array(world[other]["gpu_seconds"])
        self.cid = None
        from sage_pipeline.decisions.coder import CoderDecisionsConfig

        cc = CoderDecisionsConfig()  # the contrast's centre as coder.add_runs keeps it: a prior, then each run
        self.y_prior = (cc.centre_prior * cc.centre_prior_weight, cc.centre_prior_weight)
        self.y_sum, self.y_n = self.y_prior
        self.acc = {"runs": 0, "on_candidate": 0, "on_incumbent": 0, "cost_pending": 0.0, "cost_pinned": 0.0,
                    "rows": []}
        self.events: dict = {}

    def truth(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(E[y | incumbent], E[y | candidate]) per task on day ``n``."""
        pv_c = self.pv_cand
        if self.kind == "drift" and n >= self.S.drift_night:
            pv_c = np.clip(self.pv_inc - self.S.coder_drop, 0.0, 1.0)
        return rescale(self.S, self.pv_inc, self.g_inc), rescale(self.S, pv_c, self.g_cand)

    def start(self, eng) -> None:
        self.cid, _ = eng.propose(self.i, f"coder:{CHALLENGER if self.kind != 'null' else INCUMBENT + ' (copy)'}",
                                  night_name(0))

    def day(self, n: int, eng) -> None:
        S, N = self.S, self.N
        state = eng.state(self.i, self.cid)
        p = {"pending": 0.5, "accepted": 1.0 - S.coder_explore}.get(state)
        tasks = self.rng.integers(0, len(self.pv_inc), size=N)
        mu_i, mu_c = self.truth(n)
        pv_c = self.pv_cand if not (self.kind == "drift" and n >= S.drift_night) else np.clip(
            self.pv_inc - S.coder_drop, 0.0, 1.0)
        if p is None:
            z = np.zeros(N, dtype=bool)
        else:
            plan = assign.make_plan({"coder": [("incumbent", None, 1.0 - p, {}), ("candidate", str(self.cid), p, {})]})
            p = plan.levers["coder"][1].probability
            z = draw_arms(plan, "coder", self.rng.integers(0, assign.SCALE, size=N, dtype=np.int64)) == 1
        verified = self.rng.random(N) < np.where(z, pv_c[tasks], self.pv_inc[tasks])
        y = rescale(S, verified, np.where(z, self.g_cand[tasks], self.g_inc[tasks]))
        best = np.maximum(mu_i, mu_c)[tasks]
        lost = float(np.sum(best - np.where(z, mu_c[tasks], mu_i[tasks])))
        if state in ("pending", "accepted"):
            self.acc["cost_pending" if state == "pending" else "cost_pinned"] += lost
        self.acc["runs"] += N
        self.acc["on_candidate"] += int(z.sum()) if state == "pending" else 0
        self.acc["on_incumbent"] += int((~z).sum()) if state == "accepted" else 0
        if p is not None:
            if S.coder_centre == "run":  # the running mean of the earlier runs, fixed before each run is read
                centre = (self.y_sum + np.concatenate([[0.0], np.cumsum(y)[:-1]])) / (self.y_n + np.arange(N))
            else:  # "day": the earlier days' mean for the whole day (0.5 on the first), the benchmark before
                seen = self.acc["runs"] - N
                centre = np.full(N, (self.y_sum - self.y_prior[0]) / seen if seen else 0.5)
            x, lo, hi = ev.ipw_difference(y, z.astype(int), p, centre)
            eng.add(self.i, self.cid, "online", x, lo, hi, [f"d{n}-r{j}" for j in range(N)])
            if state == "pending" and not (self.kind == "drift" and n >= S.drift_night):
                self.acc["rows"].append({"night": n, "on": x.tolist(), "rep": []})
        self.y_sum += float(y.sum())
        self.y_n += N

    def night(self, n: int, eng) -> None:
        pass

    def apply(self, n: int, cid, new: str, eng) -> None:
        self.events[new] = n

    def result(self) -> dict:
        mu_i, mu_c = self.truth(1)
        return {"events": self.events, "effect": float(mu_c.mean() - mu_i.mean()),
                "alpha": None, **self.acc}


# =============================================================================================== router
class RouterMonth:
    def __init__(self, S: Settings, scenario: str, m: int, i: int, world: dict, code: int) -> None:
        self.S, self.i = S, i
        self.N = S.runs(scenario)
        self.rng = np.random.default_rng([S.seed, code, m])
        self.mu = rescale(S, np.array(world[INCUMBENT]["verified"]), np.array(world[INCUMBENT]["gpu_seconds"]))
        self.pv = np.array(world[INCUMBENT]["verified"])
        self.g = np.array(world[INCUMBENT]["gpu_seconds"])
        self.cands: list = []
        self.y_sum, self.y_n = 0.0, 0
        self.events: list = []
        self.plan = assign.make_plan({"router": [("deployed", None, 1.0 - S.router_explore, {}),
                                                 ("explore", None, S.router_explore, {})]})

    def start(self, eng) -> None:
        pass

    def day(self, n: int, eng) -> None:
        S, N = self.S, self.N
        tasks = self.rng.integers(0, len(self.pv), size=N)
        y = rescale(S, self.rng.random(N) < self.pv[tasks], self.g[tasks])  # tied: the same law either way
        explored = draw_arms(self.plan, "router", self.rng.integers(0, assign.SCALE, size=N, dtype=np.int64)) == 1
        p_dep, p_exp = (a.probability for a in self.plan.levers["router"])
        centre = self.y_sum / self.y_n if self.y_n else 0.5
        for cid in self.cands:
            differ = self.rng.random(N) < S.router_differ  # drawn for every candidate, pending or not
            if eng.state(self.i, cid) != "pending" or not differ.any():
                continue
            x, lo, hi = ev.ipw_contrast(y[differ], explored[differ], ~explored[differ], p_exp, p_dep, centre)
            eng.add(self.i, cid, "online", x, lo, hi, [f"d{n}-e{j}" for j in np.flatnonzero(differ).tolist()])
        self.y_sum += float(y.sum())
        self.y_n += N

    def night(self, n: int, eng) -> None:
        cid, _ = eng.propose(self.i, f"router:checkpoint-{n:02d}", night_name(n))
        self.cands.append(cid)

    def apply(self, n: int, cid, new: str, eng) -> None:
        self.events.append((n, eng.index(self.i, cid), new))

    def result(self) -> dict:
        return {"promotions": sum(1 for e in self.events if e[2] == "accepted"),
                "dropped": sum(1 for e in self.events if e[2] == "dropped"), "candidates": len(self.cands),
                "events": self.events}


# =============================================================================================== driver
def run_scenario(S: Settings, scenario: str, log=print) -> dict:
    lever = scenario.split("/")[0]
    code = SCENARIOS.index(scenario) + 1
    t0 = time.perf_counter()
    if lever == "skills":
        world, cls = SkillsWorld(S), SkillsMonth
    else:
        world, cls = coder_world(S, log), (CoderMonth if lever == "coder" else RouterMonth)
    t_world = time.perf_counter() - t0
    size = 1 if S.engine == "ledger" else S.chunk
    results, events = [], []
    t_rule = 0.0
    for lo in range(0, S.months, size):
        chunk = list(range(lo, min(S.months, lo + size)))
        eng = make_engine(S, len(chunk), lever)
        months = [cls(S, scenario, m, i, world, code) for i, m in enumerate(chunk)]
        for mo in months:
            if hasattr(mo, "start"):
                mo.start(eng)
        for n in range(1, S.nights + 1):
            for mo in months:
                mo.day(n, eng)
            for mo in months:
                mo.night(n, eng)
            t1 = time.perf_counter()
            changes = eng.decide(night_name(n))
            t_rule += time.perf_counter() - t1
            for i, cid, new in changes:
                months[i].apply(n, cid, new, eng)
                events.append((chunk[i], n, eng.index(i, cid), new))
            for mo in months:
                if hasattr(mo, "after"):
                    mo.after(n, eng)
        for i, mo in enumerate(months):
            r = mo.result()
            if lever == "coder":
                r["alpha"] = eng.alpha(i, mo.cid)
            results.append(r)
        done = len(results)
        dt = time.perf_counter() - t0
        log(f"{scenario}: {done}/{S.months} months in {dt:.0f} s ({dt / done:.2f} s a month; the rule's "
            f"add+decide {t_rule:.0f} s)")
    return {"scenario": scenario, "months": results, "events": sorted(events), "seconds": time.perf_counter() - t0,
            "seconds_world": t_world, "seconds_rule": t_rule}


# =============================================================================================== figures
def sprt_figures(S: Settings, months: list[dict], rows_of, alpha_of, delta: float, runs_per_night: int) -> dict:
    """Wald's SPRT of H0 'no gain' vs H1 '+delta' on the same observations: each stream's variance under H1
    measured on the candidate's pending observations; Wald's E[N] and the SPRT run night by night."""
    on = np.concatenate([np.asarray(r["on"]) for mo in months for r in rows_of(mo)] or [np.zeros(0)])
    rep = np.concatenate([np.asarray(r["rep"]) for mo in months for r in rows_of(mo)] or [np.zeros(0)])
    var = {"on": float(on.var()) if on.size > 1 else float("nan"), "rep": float(rep.var()) if rep.size > 1 else
           float("nan")}
    per_night = {"on": [], "rep": []}
    for mo in months:
        rows = rows_of(mo)
        if rows:
            per_night["on"].append(np.mean([len(r["on"]) for r in rows]))
            per_night["rep"].append(np.mean([len(r["rep"]) for r in rows]))
    n_on = float(np.mean(per_night["on"])) if per_night["on"] else 0.0
    n_rep = float(np.mean(per_night["rep"])) if per_night["rep"] else 0.0
    kl = {k: (delta * delta / (2 * v) if np.isfinite(v) and v > 0 else 0.0) for k, v in var.items()}
    kl_night = n_on * kl["on"] + n_rep * kl["rep"]
    alphas = [alpha_of(mo) for mo in months if rows_of(mo)]
    beta = S.sprt_beta
    wald = [wald_sprt_n(a, beta, kl_night) * runs_per_night if kl_night > 0 else float("nan") for a in alphas]
    sim = []
    for mo in months:
        rows = rows_of(mo)
        if not rows:
            continue
        a = alpha_of(mo)
        up, down, llr, got = math.log((1 - beta) / a), math.log(beta / (1 - a)), 0.0, None
        for k, r in enumerate(rows, 1):
            for name, key in (("on", "on"), ("rep", "rep")):
                xs = np.asarray(r[key])
                if xs.size and np.isfinite(var[name]) and var[name] > 0:
                    llr += float((delta * xs.sum() - xs.size * delta * delta / 2) / var[name])
            if llr >= up:
                got = k
                break
            if llr <= down:
                break
        sim.append(got * runs_per_night if got is not None else None)
    return {"variance": var, "obs_per_night": {"on": n_on, "rep": n_rep}, "kl_per_night": kl_night,
            "wald_runs": wald, "nightly_runs": sim, "beta": beta}


def _first(p: dict, key: str, threshold: float) -> int | None:
    """The first night at which the planted rule's ``key`` stream alone reached ``threshold`` (log K+(0)); after
    its accept the stream goes on with the probation era's observations of the same effect."""
    for r in p.get("by_stream", ()):
        if r[key] >= threshold:
            return r["night"]
    return None


def skills_figures(S: Settings, res: dict) -> dict:
    months, kind, N = res["months"], res["scenario"].split("/")[1], S.runs(res["scenario"])
    out: dict = {"months": len(months)}
    out["candidates_per_month"] = mean([m["candidates"] for m in months])
    out["share_runs_on_candidate"] = mean([m["on_candidate"] / m["runs"] for m in months])
    out["share_runs_on_previous"] = mean([m["on_previous"] / m["runs"] for m in months])
    out["cost_candidate_per_run"] = mean([m["cost_candidate"] / m["runs"] for m in months])
    out["cost_previous_per_run"] = mean([m["cost_previous"] / m["runs"] for m in months])
    out["replay_calls_per_night"] = mean([m["replay_calls"] / S.nights for m in months])
    out["dropped_per_month"] = mean([m["dropped"] for m in months])
    out["pending_end"] = mean([m["pending_end"] for m in months])
    if kind == "null":
        out["any_wrong_accept"] = share([m["wrong_accepts"] > 0 for m in months])
        out["useless_live_end"] = mean([m["useless_live_end"] for m in months])
        out["today_any_wrong_accept"] = share([len(m["today_wrong"]) > 0 for m in months])
        out["today_useless_live_end"] = mean([len(m["today_wrong"]) for m in months])
        out["reverted_per_month"] = mean([m["reverted"] for m in months])
        return out
    pl = [m["planted"] for m in months]
    window = 7 if N >= 40 else 14
    out["window"] = window
    out["live_within"] = share([p["accepted"] is not None and p["accepted"] <= window for p in pl])
    out["live_within_7"] = share([p["accepted"] is not None and p["accepted"] <= 7 for p in pl])
    out["live_within_14"] = share([p["accepted"] is not None and p["accepted"] <= 14 for p in pl])
    out["proposed_by_window"] = share([p["first"] is not None and p["first"] <= window for p in pl])
    out["today_within"] = share([p["today_first"] is not None and p["today_first"] <= window for p in pl])
    out["any_wrong_accept"] = share([m["wrong_accepts"] > 0 for m in months])
    out["useless_live_end"] = mean([m["useless_live_end"] for m in months])
    kept = [p for p in pl if p["accepted"] is not None and p["first"] is not None]
    ours = [float((p["accepted"] - p["first"] + 1) * N) if p in kept else None for p in pl]
    today = [float((p["today_first"] - p["first"] + 1) * N) if p["today_first"] is not None and p["first"] is not None
             else None for p in pl]
    out["runs_to_keep"] = mean(ours)
    out["online_obs_to_keep"] = mean([p["online_obs"] for p in kept])
    out["replay_calls_to_keep"] = mean([p["replay_calls"] for p in kept])
    out["online_share_of_evidence"] = mean([p["online_log"] / (p["online_log"] + p["replay_log"]) for p in kept
                                            if p.get("online_log") is not None
                                            and p["online_log"] + p["replay_log"] > 0])
    out["today_runs_to_keep"] = mean(today)
    for name in ("online", "replay"):  # the night one stream alone would have accepted it
        alone = [_first(p, name, math.log(1.0 / p["alpha"])) if p.get("alpha") else None for p in pl]
        out[f"live_within_{name}_alone"] = share([a is not None and a <= window for a in alone])
    sp = sprt_figures(S, months, lambda m: [r for r in m["planted"]["rows"] if m["planted"]["accepted"] is None
                                            or r["night"] <= m["planted"]["accepted"]],
                      lambda m: m["planted"]["alpha"], S.delta, N)
    out["sprt"] = {k: sp[k] for k in ("variance", "obs_per_night", "kl_per_night", "beta")}
    out["sprt_wald_runs"] = mean(sp["wald_runs"])
    out["sprt_nightly_runs"] = mean(sp["nightly_runs"])
    out["alpha_j"] = mean([p.get("alpha") for p in pl if p.get("alpha") is not None])
    wald_by = iter(sp["wald_runs"])
    wald_m = [next(wald_by) if m["planted"]["rows"] else None for m in months]
    sim_by = iter(sp["nightly_runs"])
    sim_m = [next(sim_by) if m["planted"]["rows"] else None for m in months]
    out["ratio_ours_to_sprt_wald"] = ratio(ours, wald_m, S.seed, S.bootstrap)
    out["ratio_ours_to_sprt_nightly"] = ratio(ours, sim_m, S.seed + 1, S.bootstrap)
    out["ratio_today_to_ours"] = ratio(today, ours, S.seed + 2, S.bootstrap)
    if kind == "drift":
        at_risk = [p for p in pl if p["accepted"] is not None and p["accepted"] < S.drift_night
                   and (p["reverted"] is None or p["reverted"] >= S.drift_night)]
        out["drift_at_risk"] = len(at_risk)
        out["reverted_within_7"] = share([p["reverted"] is not None and p["reverted"] <= S.drift_night + 6
                                          for p in at_risk])
        out["nights_to_revert"] = mean([p["reverted"] - S.drift_night + 1 for p in at_risk if p["reverted"]])
        out["reverted_before_drift"] = share([p["reverted"] is not None and p["reverted"] < S.drift_night
                                              for p in pl if p["accepted"] is not None])
        for name in ("online", "replay"):
            out[f"revert_log_{name}"] = mean([p[f"revert_{name}_log"] for p in at_risk
                                               if p.get(f"revert_{name}_log") is not None])
    return out


def coder_figures(S: Settings, res: dict) -> dict:
    months, kind, N = res["months"], res["scenario"].split("/")[1], S.runs(res["scenario"])
    out: dict = {"months": len(months), "effect": mean([m["effect"] for m in months])}
    out["share_runs_on_candidate_pending"] = mean([m["on_candidate"] / m["runs"] for m in months])
    out["share_runs_on_incumbent_pinned"] = mean([m["on_incumbent"] / m["runs"] for m in months])
    out["cost_pending_per_run"] = mean([m["cost_pending"] / m["runs"] for m in months])
    out["cost_pinned_per_run"] = mean([m["cost_pinned"] / m["runs"] for m in months])
    acc = [m["events"].get("accepted") for m in months]
    if kind == "null":
        out["any_wrong_pin"] = share([a is not None for a in acc])
        return out
    out["pinned_within_14"] = share([a is not None and a <= 14 for a in acc])
    out["pinned_within_month"] = share([a is not None for a in acc])
    out["pinned_within_7"] = share([a is not None and a <= 7 for a in acc])
    ours = [float(a * N) if a is not None else None for a in acc]
    out["runs_to_pin"] = mean(ours)
    if kind != "gap":
        return drift_figures(S, months, out)
    delta = out["effect"]["value"] if kind == "gap" else mean([m["effect"] for m in months])["value"]
    sp = sprt_figures(S, months, lambda m: [r for r in m["rows"] if m["events"].get("accepted") is None
                                            or r["night"] <= m["events"]["accepted"]], lambda m: m["alpha"], delta, N)
    out["sprt"] = {k: sp[k] for k in ("variance", "obs_per_night", "kl_per_night", "beta")}
    out["sprt_delta"] = delta
    out["sprt_wald_runs"] = mean(sp["wald_runs"])
    out["sprt_nightly_runs"] = mean(sp["nightly_runs"])
    out["ratio_ours_to_sprt_wald"] = ratio(ours, sp["wald_runs"], S.seed, S.bootstrap)
    out["ratio_ours_to_sprt_nightly"] = ratio(ours, sp["nightly_runs"], S.seed + 1, S.bootstrap)
    return out


def drift_figures(S: Settings, months: list[dict], out: dict) -> dict:
    """The coder's drift: months pinned before ``drift_night`` (and not reverted before it), reverted within 7."""
    ev_ = [m["events"] for m in months]
    at_risk = [e for e in ev_ if e.get("accepted") is not None and e["accepted"] < S.drift_night
               and e.get("reverted", S.drift_night) >= S.drift_night]
    out["drift_at_risk"] = len(at_risk)
    out["reverted_within_7"] = share([e.get("reverted") is not None and e["reverted"] <= S.drift_night + 6
                                      for e in at_risk])
    out["nights_to_revert"] = mean([e["reverted"] - S.drift_night + 1 for e in at_risk if e.get("reverted")])
    out["reverted_before_drift"] = share([e.get("reverted") is not None and e["reverted"] < S.drift_night
                                          for e in ev_ if e.get("accepted") is not None])
    return out


def router_figures(S: Settings, res: dict) -> dict:
    months = res["months"]
    return {"months": len(months), "any_wrong_promotion": share([m["promotions"] > 0 for m in months]),
            "candidates_per_month": mean([m["candidates"] for m in months]),
            "dropped_per_month": mean([m["dropped"] for m in months])}


FIGURES = {"skills": skills_figures, "coder": coder_figures, "router": router_figures}


# =============================================================================================== printing
def fmt(f: dict | None, pct: bool = False, digits: int = 3) -> str:
    if not f or f.get("n", 1) == 0 or not np.isfinite(f["value"]):
        return "-"
    lo, hi = f["ci"]
    if f["kind"] == "share":
        return f"{f['k']}/{f['n']} = {100 * f['value']:.1f}% ({100 * lo:.1f}-{100 * hi:.1f}%)"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{f['value']:.{digits}f}"
    return f"{f['value']:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def goal(f: dict | None, op: str, bound: float, on: str = "value") -> str:
    if not f or f.get("n", 1) == 0 or not np.isfinite(f["value"]):
        return "-"
    v = f["value"]
    ok = v <= bound if op == "<=" else v >= bound
    return f"{op} {bound:g}: {'met' if ok else 'NOT met'}"


def table(S: Settings, figs: dict[str, dict]) -> str:
    lines = ["| lever / scenario | figure | value (95% interval) | goal |", "|---|---|---|---|"]

    def row(sc: str, name: str, f, g: str = "", digits: int = 3) -> None:
        lines.append(f"| {sc} | {name} | {fmt(f, digits=digits)} | {g} |")

    for sc, f in figs.items():
        lever, kind, n = sc.split("/")
        if lever == "skills" and kind == "null":
            row(sc, "months with any wrong accept (ledger)", f["any_wrong_accept"], goal(f["any_wrong_accept"], "<=",
                                                                                         0.05))
            row(sc, "useless rules live at the month's end (ledger)", f["useless_live_end"],
                goal(f["useless_live_end"], "<=", 0.05))
            row(sc, "months with any wrong accept (today's per-night test)", f["today_any_wrong_accept"])
            row(sc, "useless rules live at the end (today's: never undone)", f["today_useless_live_end"])
            row(sc, "useless rules reverted a month (probation)", f["reverted_per_month"])
        elif lever == "skills":
            w = f["window"]
            row(sc, f"planted rule live within {w} nights (ledger)", f["live_within"],
                goal(f["live_within"], ">=", 0.8) if kind == "planted" else "")
            if kind == "planted":
                row(sc, f"planted rule first proposed within {w} nights", f["proposed_by_window"])
                row(sc, f"kept within {w} nights by today's per-night test", f["today_within"])
                row(sc, "runs to keep it, from its first proposal (ledger; months kept)", f["runs_to_keep"], digits=1)
                row(sc, "  Wald's SPRT E[N] (same observations, alpha_j, beta "
                    f"{S.sprt_beta:g}; approximation)", f["sprt_wald_runs"], digits=1)
                row(sc, "  SPRT run night by night on the same observations", f["sprt_nightly_runs"], digits=1)
                row(sc, "  today's per-night test", f["today_runs_to_keep"], digits=1)
                row(sc, "  ratio ledger / SPRT (Wald)", f["ratio_ours_to_sprt_wald"],
                    goal(f["ratio_ours_to_sprt_wald"], "<=", 1.5), digits=2)
                row(sc, "  ratio ledger / SPRT (nightly)", f["ratio_ours_to_sprt_nightly"],
                    goal(f["ratio_ours_to_sprt_nightly"], "<=", 1.5), digits=2)
                row(sc, "  ratio today's / ledger", f["ratio_today_to_ours"], digits=2)
                row(sc, "replay calls to keep it (its arm + the baseline)", f["replay_calls_to_keep"], digits=0)
                row(sc, "online observations to keep it", f["online_obs_to_keep"], digits=1)
                row(sc, "share of the accepting log-evidence from the randomised runs",
                    f["online_share_of_evidence"])
                row(sc, f"  live within {w} nights on the replays alone (no randomised runs)",
                    f["live_within_replay_alone"])
                row(sc, f"  live within {w} nights on the randomised runs alone (no replays)",
                    f["live_within_online_alone"])
                row(sc, "months with a useless rule accepted alongside", f["any_wrong_accept"])
            if kind == "drift":
                row(sc, f"reverted within 7 nights of night {S.drift_night} (of {f['drift_at_risk']} months with "
                    "it live then)", f["reverted_within_7"], goal(f["reverted_within_7"], ">=", 0.8))
                row(sc, "nights to revert (1 = the drift's first night)", f["nights_to_revert"], digits=2)
                row(sc, "reverted before the drift (a good rule undone)", f["reverted_before_drift"])
                row(sc, f"  log K-({LedgerConfig().min_useful_gain:g}) at the revert: probation runs (revert at "
                    f"log 20 = {math.log(20):.2f})", f["revert_log_online"], digits=2)
                row(sc, "  log K- at the revert: probation replays", f["revert_log_replay"], digits=2)
        if lever == "skills":
            row(sc, "share of runs on a pending candidate's tree", f["share_runs_on_candidate"])
            row(sc, "share of runs on a previous tree (probation)", f["share_runs_on_previous"])
            row(sc, "pass chance lost per run on candidates' trees (exact; < 0: gained)", f["cost_candidate_per_run"],
                digits=4)
            row(sc, "pass chance lost per run on previous trees (exact; < 0: gained)", f["cost_previous_per_run"],
                digits=4)
            row(sc, "replay calls a night", f["replay_calls_per_night"], digits=0)
            row(sc, "candidates proposed a month", f["candidates_per_month"], digits=1)
            row(sc, "  dropped a month", f["dropped_per_month"], digits=1)
            row(sc, "  still pending at the month's end", f["pending_end"], digits=1)
        if lever == "coder":
            row(sc, "true effect of the candidate on y (rescaled task_v1)", f["effect"], digits=4)
            if kind == "null":
                row(sc, "months with a wrong pin", f["any_wrong_pin"], goal(f["any_wrong_pin"], "<=", 0.05))
            else:
                row(sc, "pinned within 14 nights", f["pinned_within_14"],
                    goal(f["pinned_within_14"], ">=", 0.8) if kind == "gap" else "")
                row(sc, "pinned within 7 nights", f["pinned_within_7"])
            if kind == "gap":
                row(sc, f"pinned within the month ({S.nights} nights)", f["pinned_within_month"])
                row(sc, "runs to pin (ledger; months pinned)", f["runs_to_pin"], digits=1)
                row(sc, f"  Wald's SPRT E[N] (delta {f['sprt_delta']:.4f}, alpha_1, beta {S.sprt_beta:g})",
                    f["sprt_wald_runs"], digits=1)
                row(sc, "  SPRT run night by night on the same observations", f["sprt_nightly_runs"], digits=1)
                row(sc, "  ratio ledger / SPRT (Wald)", f["ratio_ours_to_sprt_wald"],
                    goal(f["ratio_ours_to_sprt_wald"], "<=", 1.5), digits=2)
                row(sc, "  ratio ledger / SPRT (nightly)", f["ratio_ours_to_sprt_nightly"],
                    goal(f["ratio_ours_to_sprt_nightly"], "<=", 1.5), digits=2)
            if kind == "drift":
                row(sc, f"reverted within 7 nights of night {S.drift_night} (of {f['drift_at_risk']} months pinned "
                    "then)", f["reverted_within_7"], goal(f["reverted_within_7"], ">=", 0.8))
                row(sc, "nights to revert", f["nights_to_revert"], digits=2)
                row(sc, "reverted before the drift", f["reverted_before_drift"])
            row(sc, "share of runs on the candidate while pending", f["share_runs_on_candidate_pending"])
            row(sc, "share of runs on the other model after a pin", f["share_runs_on_incumbent_pinned"])
            row(sc, "y lost per run to the worse model while pending (exact)", f["cost_pending_per_run"], digits=4)
            row(sc, "y lost per run to the worse model after a pin (exact)", f["cost_pinned_per_run"], digits=4)
        if lever == "router":
            row(sc, "months with any wrong promotion", f["any_wrong_promotion"],
                goal(f["any_wrong_promotion"], "<=", 0.05))
            row(sc, "candidates a month", f["candidates_per_month"], digits=1)
            row(sc, "candidates dropped a month", f["dropped_per_month"], digits=1)
    return "\n".join(lines)


# =============================================================================================== main
def clean(obj):
    """JSON without NaN: a figure with no value is null."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _one(args: tuple[Settings, str]) -> dict:
    S, sc = args
    return run_scenario(S, sc, log=lambda m: print(m, flush=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--months", type=count, default=200)
    p.add_argument("--nights", type=count, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=("batch", "ledger"), default="batch")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--workers", type=count, default=1, help="scenarios run in this many processes")
    p.add_argument("--samples", type=count, default=Settings.samples)
    p.add_argument("--val-share", type=float, default=Settings.val_share)
    p.add_argument("--replay-candidates", type=int, default=Settings.replay_candidates)
    p.add_argument("--candidate-share", type=float, default=Settings.candidate_share)
    p.add_argument("--probation-share", type=float, default=Settings.probation_share)
    p.add_argument("--coder-explore", type=float, default=Settings.coder_explore)
    p.add_argument("--world-tasks", type=count, default=Settings.world_tasks)
    p.add_argument("--cap", type=float, default=Settings.cap, help="the bets' cap (EvidenceConfig.cap; the "
                   "product's default 0.5)")
    p.add_argument("--probation-half-life", type=float, default=Settings.probation_half_life)
    p.add_argument("--coder-first-takes-all", action="store_true", help="the coder lever's one candidate at alpha "
                   "(gamma_1 = 1) instead of alpha * first_share")
    p.add_argument("--coder-bet", choices=("plug_in", "mixture"), default=Settings.coder_bet,
                   help="the coder candidates' bets (LedgerConfig.coder_evidence.bet)")
    p.add_argument("--skills-online-bet", choices=("plug_in", "mixture"), default=Settings.skills_online_bet,
                   help="the skills lever's randomised runs' bets (LedgerConfig.online_evidence; plug_in: bet with "
                   "evidence, as the replays, the rule before ledger schema 4)")
    p.add_argument("--coder-first-share", type=float, default=None, help="the coder's level spent geometrically "
                   "with this first share (LedgerConfig.first_share['coder']; 0.5 and below: about the harmonic "
                   "1/(j(j+1)) for the first)")
    p.add_argument("--coder-centre", choices=("run", "day"), default=Settings.coder_centre,
                   help="the contrast's centre: the running mean before each run (the product's), or fixed a day")
    p.add_argument("--quick", action="store_true", help="a smoke run: 10 months of 10 nights, drift at night 5, "
                   "a 60-task world")
    p.add_argument("--out", type=Path, default=SCRATCH / "decision_month.json")
    a = p.parse_args(argv)
    S = Settings(months=a.months, nights=a.nights, seed=a.seed, engine=a.engine, samples=a.samples,
                 val_share=a.val_share, replay_candidates=a.replay_candidates, candidate_share=a.candidate_share,
                 probation_share=a.probation_share, coder_explore=a.coder_explore, world_tasks=a.world_tasks,
                 cap=a.cap, probation_half_life=a.probation_half_life, coder_first_takes_all=a.coder_first_takes_all,
                 coder_bet=a.coder_bet, coder_first_share=a.coder_first_share, coder_centre=a.coder_centre,
                 skills_online_bet=a.skills_online_bet)
    if a.quick:
        S = dataclasses.replace(S, months=min(a.months, 10), nights=min(a.nights, 10), drift_night=5, world_tasks=60,
                                per_topic=40, bootstrap=200)
    print(f"decision_month: {S.months} months x {S.nights} nights, engine {S.engine}, scenarios "
          f"{', '.join(a.scenarios)}; load average {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.perf_counter()
    if "coder" in " ".join(a.scenarios) or "router" in " ".join(a.scenarios):
        coder_world(S, lambda m: print(m, flush=True))  # built once, before the workers start
    cost = {"skills/planted/40": 6, "skills/drift/40": 5, "skills/null/40": 4, "skills/planted/20": 3,
            "skills/null/20": 2}
    jobs = [(S, sc) for sc in sorted(a.scenarios, key=lambda sc: -cost.get(sc, 0))]
    if a.workers > 1:
        with ProcessPoolExecutor(a.workers) as pool:
            runs = list(pool.map(_one, jobs))
    else:
        runs = [_one(j) for j in jobs]
    runs.sort(key=lambda r: SCENARIOS.index(r["scenario"]))
    figs = {r["scenario"]: FIGURES[r["scenario"].split("/")[0]](S, r) for r in runs}
    wall = time.perf_counter() - t0
    print()
    print(table(S, figs))
    print(f"\nwall {wall:.0f} s; per scenario: " + ", ".join(f"{r['scenario']} {r['seconds']:.0f} s (rule "
                                                             f"{r['seconds_rule']:.0f} s)" for r in runs))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    out = {"settings": dataclasses.asdict(S), "scenarios": list(a.scenarios), "figures": figs, "wall_s": wall,
           "seconds": {r["scenario"]: {"total": r["seconds"], "rule": r["seconds_rule"], "world": r["seconds_world"]}
                       for r in runs},
           "events": {r["scenario"]: r["events"] for r in runs},
           "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
                       "load_average_after": os.getloadavg()[0]}}
    from sage_pipeline import artifacts

    artifacts.write_json(a.out, clean(out))
    print(f"results: {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
