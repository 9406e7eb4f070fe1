"""The decision ledger: every candidate change to what SAGE runs, on every lever, with its evidence,
its history and the runs it was judged on.

**Levers** are the ways to change SAGE's outcomes (ARCHITECTURE.md, "What SAGE runs unchanged"):
``skills`` (an edit of one skill in the root SAGE injects), ``coder`` (the coder's model in
``models.yaml``) and ``router`` (the router checkpoint). A **candidate** is one proposed change
(``key``: the normalised rule text with its skill, the model id, the checkpoint's sha256); proposing
the same key again continues the same candidate and its evidence, never a fresh test.

**States and the only transitions** (:data:`TRANSITIONS`; anything else is a :class:`LedgerError`)::

    pending  --accept-->  accepted  --revert-->  reverted
    pending  --drop---->  dropped

- *pending*: its evidence accumulates night after night (:mod:`.evidence`). Accepted when the
  e-process against "no gain" reaches ``1 / alpha_j``; dropped when its confidence sequence lies
  below the minimum useful gain (its e-process against "gain >= min_useful_gain" reaches
  ``1 / drop_alpha``: it cannot be worth keeping) or it stayed pending ``max_pending_nights``.
- *accepted* (on probation): deployed, and still tested on new runs with a probation stream
  started at the acceptance. Reverted when that stream's e-process against "gain >= min_useful_gain"
  reaches ``1 / revert_alpha`` (its gain is excluded: harmful, or useless).
- *reverted* and *dropped* are final: the key is never tested again (a fresh look would spend the
  level again on data that already spoke).

**The level over the horizon and over candidates.** Candidate ``j`` of a lever (``j = 1, 2, ...``
in the order they were proposed) is accepted at ``alpha_j = alpha * gamma_j``, the ``gamma_j`` summing to
at most 1 and fixed before any evidence: ``gamma_j = 1 / (j (j + 1))`` for a lever whose proposals are an
open-ended stream (skills, router); ``gamma_j = s (1 - s)^(j - 1)`` with ``s`` the lever's
``first_share`` for a lever that proposes few candidates (the coder: two a round, a new round only after a
revert or a round without a pin), so the first gets most of the level (its sibling and later rounds
pay for it). Each candidate's e-process is
valid at every night forever (Ville), so: *for each lever, the chance that any candidate without a gain is
ever accepted, over all nights and all candidates, is at most alpha* (online Bonferroni over e-processes).

**The bets per lever** (:meth:`LedgerConfig.evidence_for`): ``evidence`` (the plug-in) for the skills
lever's paired replays and the router, ``online_evidence`` (the mixture over gains, :mod:`.evidence`) for the
skills lever's randomised runs, ``coder_evidence`` (the mixture) for the coder's; probation streams
always bet the plug-in with ``probation_half_life`` (a bet that follows a turn: fixed bets started at the
accept lose wealth while the gain still holds, and a revert would have to win it back).

**What a candidate was selected on, compactly** (``selected_on_ids``): a lever whose proposals look at
thousands of units (the router: every episode of its train and select split) keeps them as an :class:`IdSet`
(their count and the sha256 of the sorted ids, one a line) with the ids themselves in ``ids/<sha256>.txt``
beside the ledger, content-addressed and written once, before the ledger that names them (a kill never
leaves a ledger naming a missing file). :meth:`Ledger.selected` reads the file back, checked against the
count and the sha256, and the ledger refuses those units as evidence as it refuses ``selected_on``.

**Schema.** Version 2 added ``coder_evidence`` and ``first_share``; a version-1 file is read with the rule
it was written under (the coder betting its ``evidence``, every lever at ``1 / (j (j + 1))``): its levels
were spent under it. Version 3 added ``selected_on_ids`` (a version-2 file has none: read as it is).
Version 4 added ``online_evidence``; a version-3 file keeps betting its skills runs with its ``evidence`` (a
stream goes on with the bets it was started with).

The ledger is one JSON file written atomically (``artifacts.write_json``: a kill leaves the old or
the new ledger whole), read back through a typed schema; it travels inside the bundle it decided.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sage_pipeline import artifacts
from sage_pipeline.decisions import evidence as ev

LEDGER_NAME = "ledger.json"
SCHEMA_VERSION = 4
IDS_DIR = "ids"  # beside the ledger: <sha256>.txt, the id sets candidates name
LEVERS = ("skills", "coder", "router")
State = Literal["pending", "accepted", "reverted", "dropped"]
TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"accepted", "dropped"}),
    "accepted": frozenset({"reverted"}),
    "reverted": frozenset(),
    "dropped": frozenset(),
}


class LedgerError(ValueError):
    """A transition the ledger does not allow, evidence it must refuse, or a ledger file it cannot read
    (the message names the file and the field)."""


class LedgerConfig(BaseModel):
    """The ledger's decision rule (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="per lever: the chance any candidate without a gain is "
                         "ever accepted, over every night and every candidate")
    revert_alpha: float = Field(0.05, gt=0.0, lt=0.5, description="per accepted candidate: the chance it is ever "
                                "reverted while its gain is at least min_useful_gain")
    min_useful_gain: float = Field(0.03, gt=0.0, lt=1.0, description="the smallest gain in the objective (verified "
                                   "share, task_v1) worth keeping a change for: half the coder pair's true gap "
                                   "(+0.06) and a fifth of a strong skill rule's (+0.15); an accepted change whose "
                                   "gain is shown below it is reverted, a pending one dropped")
    probation_half_life: float = Field(60.0, gt=0.0, description="the probation bets' half-life in observations: "
                                       "short, so a gain that turns is followed within a night or two of runs")
    drop_alpha: float = Field(0.1, gt=0.0, lt=0.5, description="a pending candidate is dropped when its e-process "
                              "against 'gain >= min_useful_gain' reaches 1/drop_alpha: a drop spends no false-accept "
                              "level, so it has a level of its own (the chance a candidate worth min_useful_gain is "
                              "ever dropped that way)")
    probation_cap: float = Field(0.5, gt=0.0, lt=1.0, description="the probation bets' cap (a share of the largest "
                                 "safe bet): its short half-life makes the plug-in noisy, and at 0.9 a pinned coder "
                                 "gone bad was reverted within 7 nights in about half the months, not most")
    max_pending_nights: int = Field(30, ge=1, description="nights a candidate may stay pending before it is dropped "
                                    "as unresolvable (its evidence is kept in the ledger)")
    evidence: ev.EvidenceConfig = Field(default_factory=ev.EvidenceConfig, description="the bets of the skills "
                                        "lever's paired replays and the router lever's episodes (pending candidates)")
    online_evidence: ev.EvidenceConfig = Field(
        default_factory=lambda: ev.EvidenceConfig(bet="mixture", mixture_gaps=(0.03, 0.06, 0.12, 0.24)),
        description="the bets of the skills lever's randomised runs (pending candidates): the mixture over gains "
        "from min_useful_gain to a strong rule's +0.24 (an IPW contrast of variance ~1, whose plug-in bets lost "
        "wealth while their mean was noisy; with the mixture the runs add 5% to the accepting evidence and a "
        "+0.15 rule is kept in 98 runs where it took 112: benchmarks/decision_month.py)")
    coder_evidence: ev.EvidenceConfig = Field(default_factory=lambda: ev.EvidenceConfig(bet="mixture"),
                                              description="the bets of the coder's pending candidates: the mixture "
                                              "over gains (randomised runs of variance ~0.25 whose best bet is well "
                                              "inside the safe one, where the plug-in's noise costs the most)")
    first_share: dict[Literal["skills", "coder", "router"], float] = Field(
        default_factory=lambda: {"coder": 0.9}, description="levers whose levels are spent geometrically: candidate "
        "j at alpha s (1 - s)^(j - 1); the others at alpha / (j (j + 1)). The coder 0.9: its first candidate (the "
        "preferred model of the first round) at 0.045 where 1/(j(j+1)) gave 0.025, its sibling at 0.0045 (0.0083), "
        "each later one (a round after a revert) a tenth of the one before; at 0.8 the +0.06 pair was pinned within "
        "14 nights in 79.5% of months, at 0.9 in 81.5% (benchmarks/decision_month.py)")

    @field_validator("first_share")
    @classmethod
    def _shares(cls, v: dict) -> dict:
        if any(not (0.0 < s <= 1.0) for s in v.values()):
            raise ValueError("first_share: each share in (0, 1]")
        return v

    def evidence_for(self, lever: str, stream: str | None = None) -> ev.EvidenceConfig:
        """The bets of ``lever``'s pending candidates on evidence ``stream`` (the skills lever bets its
        randomised runs, ``"online"``, with ``online_evidence`` and its replays with ``evidence``)."""
        if lever == "coder":
            return self.coder_evidence
        return self.online_evidence if lever == "skills" and stream == "online" else self.evidence

    def probation_evidence(self, lever: str = "skills") -> ev.EvidenceConfig:
        """The evidence settings of ``lever``'s probation streams: its bets' config with the plug-in,
        ``probation_half_life`` and ``probation_cap``."""
        return self.evidence_for(lever).model_copy(update={"half_life": self.probation_half_life,
                                                           "cap": self.probation_cap, "bet": "plug_in"})

    def alpha_for(self, index: int, lever: str | None = None) -> float:
        """The accept level of ``lever``'s ``index``-th candidate (1-based): ``alpha s (1 - s)^(j - 1)`` for a
        lever in ``first_share``, else ``alpha / (j (j + 1))``."""
        if index < 1:
            raise LedgerError(f"candidate index {index}: indices start at 1")
        s = self.first_share.get(lever) if lever is not None else None
        if s is not None:
            return self.alpha * s * (1.0 - s) ** (index - 1)
        return self.alpha / (index * (index + 1))

    def nulls(self) -> np.ndarray:
        return ev.grid(self.evidence, (self.min_useful_gain, -self.min_useful_gain))


class Transition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    night: str
    state: State
    reason: str
    at: str


class NightRow(BaseModel):
    """One night's look at a candidate: what it added and where its evidence stood after."""

    model_config = ConfigDict(extra="forbid")
    night: str
    observations: dict[str, int] = Field(default_factory=dict)  # stream -> observations so far
    estimate: float | None = None
    ci: tuple[float | None, float | None] = (None, None)
    evidence: float = 1.0  # K+(0): against "no gain"
    needed: float = 1.0  # 1 / alpha_j
    revert_evidence: float | None = None  # probation: K-(min_useful_gain)
    state: State = "pending"
    note: str = ""


class IdSet(BaseModel):
    """A set of unit ids kept beside the ledger (``ids/<sha256>.txt``): how many, and the sha256 of the sorted
    ids, one a line (each line ending in a newline)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @staticmethod
    def text(ids) -> str:
        return "".join(f"{u}\n" for u in sorted({str(u) for u in ids}))

    @classmethod
    def of(cls, ids) -> tuple[IdSet, str]:
        t = cls.text(ids)
        bad = [u for u in ids if "\n" in str(u) or not str(u)]
        if bad:
            raise LedgerError(f"unit id {bad[0]!r}: ids are non-empty and on one line")
        return cls(count=t.count("\n"), sha256=hashlib.sha256(t.encode("utf-8")).hexdigest()), t


class Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    lever: Literal["skills", "coder", "router"]
    key: str
    index: int = Field(ge=1)
    alpha: float
    description: str = ""
    payload: dict = Field(default_factory=dict)  # what to deploy: a version id, a model, a checkpoint path
    selected_on: list[str] = Field(default_factory=list)  # units its proposal looked at: never its evidence
    selected_on_ids: IdSet | None = None  # more of them, kept in ids/<sha256>.txt (Ledger.selected reads both)
    state: State = "pending"
    proposed: str
    history: list[Transition] = Field(default_factory=list)
    streams: dict[str, dict] = Field(default_factory=dict)  # name -> evidence.Stream.to_dict()
    probation: dict[str, dict] = Field(default_factory=dict)  # the same, from the acceptance on
    judged_on: dict[str, list[str]] = Field(default_factory=dict)  # stream -> unit ids (runs, tasks) used
    nights: list[NightRow] = Field(default_factory=list)


class LedgerFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[4] = SCHEMA_VERSION
    config: LedgerConfig = Field(default_factory=LedgerConfig)
    next_index: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(LEVERS, 1))
    candidates: list[Candidate] = Field(default_factory=list)
    seq: int = 0  # bumped on every save


def _from_v1(raw: dict) -> dict:
    """A version-1 ledger as version 2 with the rule it was written under: the coder's bets its ``evidence``,
    every lever's levels ``alpha / (j (j + 1))``."""
    raw = dict(raw, schema_version=2)
    cfg = raw.get("config", {})
    if isinstance(cfg, dict):  # anything else is refused by the schema, naming the field
        raw["config"] = {**cfg, "coder_evidence": cfg.get("evidence", {}), "first_share": {}}
    return raw


def _from_v3(raw: dict) -> dict:
    """A version-3 ledger as version 4 with the rule it was written under: the skills lever's randomised runs
    bet its ``evidence`` (the plug-in), as its streams were started."""
    raw = dict(raw, schema_version=4)
    cfg = raw.get("config", {})
    if isinstance(cfg, dict):  # anything else is refused by the schema, naming the field
        raw["config"] = {**cfg, "online_evidence": cfg.get("evidence", {})}
    return raw


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Ledger:
    """The ledger in memory; :meth:`save` writes it whole. Every state change goes through
    :meth:`transition`, which enforces :data:`TRANSITIONS` and records why."""

    def __init__(self, data: LedgerFile | None = None, path: Path | None = None):
        self.data = data or LedgerFile()
        self.path = path
        self._live: dict[tuple[str, str, str], ev.Stream] = {}  # (id, "streams"|"probation", name): in memory
        self._ids: dict[str, tuple[frozenset[str], str]] = {}  # sha256 -> (ids, file text): made or read here

    # ---- storage ----
    @classmethod
    def load(cls, path: str | os.PathLike[str], config: LedgerConfig | None = None) -> Ledger:
        """The ledger at ``path`` (a fresh one when it does not exist, with ``config``). A ledger saved
        with another config keeps its own: its levels were spent under it."""
        p = Path(path)
        if not p.exists():
            return cls(LedgerFile(config=config or LedgerConfig()), p)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LedgerError(f"{p}: not a readable ledger ({e}); restore it from the last bundle "
                              f"(it carries {LEDGER_NAME}) rather than starting a new one") from None
        if isinstance(raw, dict) and raw.get("schema_version") == 1:
            raw = _from_v1(raw)
        if isinstance(raw, dict) and raw.get("schema_version") == 2:
            raw = dict(raw, schema_version=3)  # version 3 only added selected_on_ids (default none)
        if isinstance(raw, dict) and raw.get("schema_version") == 3:
            raw = _from_v3(raw)
        try:
            data = LedgerFile.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(x) for x in first["loc"])
            raise LedgerError(f"{p}: field {field!r}: {first['msg']} ({len(e.errors())} error(s)); the ledger "
                              "must be one the project wrote") from None
        return cls(data, p)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        p = Path(path) if path is not None else self.path
        if p is None:
            raise LedgerError("the ledger has no path to be saved to")
        self._flush()
        for c in self.data.candidates:  # the id sets first: the ledger never names a file not yet written
            ref = c.selected_on_ids
            if ref is None:
                continue
            f = p.parent / IDS_DIR / f"{ref.sha256}.txt"
            if f.is_file():
                continue  # content-addressed: written once
            self.selected(c)  # made here, or read back from beside where this ledger was loaded (checked)
            artifacts.write_text(f, self._ids[ref.sha256][1])
        self.data.seq += 1
        artifacts.write_text(p, self.data.model_dump_json(indent=1))
        self.path = p
        return p

    def selected(self, c: Candidate) -> frozenset[str]:
        """Every unit ``c``'s proposal looked at: ``selected_on`` and the id set ``selected_on_ids`` names (read
        from ``ids/<sha256>.txt`` beside the ledger, checked against its count and sha256)."""
        ref = c.selected_on_ids
        if ref is None:
            return frozenset(c.selected_on)
        if ref.sha256 not in self._ids:
            f = (self.path.parent if self.path is not None else Path(".")) / IDS_DIR / f"{ref.sha256}.txt"
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise LedgerError(f"{f}: candidate {c.id}'s selected-on ids cannot be read ({e}); restore "
                                  f"{IDS_DIR}/ beside {self.path} (it travels with the ledger)") from None
            got = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if got != ref.sha256 or text.count("\n") != ref.count:
                raise LedgerError(f"{f}: sha256 {got[:12]} and {text.count(chr(10))} ids, but candidate {c.id}'s "
                                  f"selected_on_ids says {ref.sha256[:12]} and {ref.count}: the file was changed")
            self._ids[ref.sha256] = (frozenset(text.splitlines()), text)
        return frozenset(c.selected_on) | self._ids[ref.sha256][0]

    def save_lever(self, lever: str, path: str | os.PathLike[str] | None = None) -> Path:
        """Save with ``lever``'s candidates and next index as this ledger has them and every other lever's as
        the file has them now (another lever's night may have saved meanwhile), under ``<ledger>.lock``: the
        way every lever saves, so two levers deciding at once never lose each other's decisions."""
        import filelock

        if lever not in LEVERS:
            raise LedgerError(f"unknown lever {lever!r}: one of {', '.join(LEVERS)}")
        p = Path(path) if path is not None else self.path
        if p is None:
            raise LedgerError("the ledger has no path to be saved to")
        p.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(p) + ".lock"):
            self._flush()
            if p.exists():
                disk = Ledger.load(p)
                mine = {c.id for c in self.data.candidates if c.lever == lever}
                self._live = {k: v for k, v in self._live.items() if k[0] in mine}
                self.data.candidates = ([c for c in disk.data.candidates if c.lever != lever]
                                        + [c for c in self.data.candidates if c.lever == lever])
                self.data.next_index = {**disk.data.next_index, lever: self.data.next_index.get(lever, 1)}
                self.data.seq = max(self.data.seq, disk.data.seq)
            return self.save(p)

    @property
    def config(self) -> LedgerConfig:
        return self.data.config

    # ---- candidates ----
    def get(self, cid: str) -> Candidate:
        for c in self.data.candidates:
            if c.id == cid:
                return c
        raise LedgerError(f"no candidate {cid!r} in the ledger")

    def find(self, lever: str, key: str) -> Candidate | None:
        for c in self.data.candidates:
            if c.lever == lever and c.key == key:
                return c
        return None

    def of(self, lever: str, *states: str) -> list[Candidate]:
        return [c for c in self.data.candidates if c.lever == lever and (not states or c.state in states)]

    def _compact(self, c: Candidate, ids) -> None:
        ref, text = IdSet.of(ids)
        self._ids[ref.sha256] = (frozenset(text.splitlines()), text)
        c.selected_on, c.selected_on_ids = [], ref

    def propose(self, lever: str, key: str, *, night: str, description: str = "", payload: dict | None = None,
                selected_on: Sequence[str] = (), compact: bool = False) -> tuple[Candidate, bool]:
        """The candidate for ``key`` on ``lever``: the existing one (its evidence carried on; False) or a
        new pending one with the lever's next index and level (True). ``compact``: keep what it was selected on
        as an id set beside the ledger (``selected_on_ids``), not a list inside it."""
        if lever not in LEVERS:
            raise LedgerError(f"unknown lever {lever!r}: one of {', '.join(LEVERS)}")
        old = self.find(lever, key)
        if old is not None:
            if compact or old.selected_on_ids is not None:
                union = self.selected(old) | set(map(str, selected_on))
                if union:
                    self._compact(old, union)
            else:
                old.selected_on = sorted(set(old.selected_on) | set(selected_on))
            return old, False
        j = self.data.next_index.get(lever, 1)
        self.data.next_index[lever] = j + 1
        cid = f"{lever}-{j:04d}"
        c = Candidate(id=cid, lever=lever, key=key, index=j, alpha=self.config.alpha_for(j, lever),
                      description=description, payload=dict(payload or {}), selected_on=sorted(set(selected_on)),
                      proposed=night,
                      history=[Transition(night=night, state="pending", reason="proposed", at=_now())])
        if compact and c.selected_on:
            self._compact(c, c.selected_on)
        self.data.candidates.append(c)
        return c, True

    def transition(self, cid: str, to: str, *, night: str, reason: str) -> Candidate:
        c = self.get(cid)
        if to not in TRANSITIONS.get(c.state, ()):
            raise LedgerError(f"candidate {cid} is {c.state}: it cannot become {to} (allowed: "
                              f"{', '.join(sorted(TRANSITIONS[c.state])) or 'none, the state is final'})")
        if not reason:
            raise LedgerError(f"candidate {cid}: a transition needs its reason")
        c.state = to
        c.history.append(Transition(night=night, state=to, reason=reason, at=_now()))
        if to == "accepted":  # probation starts now, on new runs only
            c.probation = {}
            self._live = {k: v for k, v in self._live.items() if not (k[0] == cid and k[1] == "probation")}
        return c

    # ---- evidence ----
    def _stream(self, c: Candidate, store: str, name: str) -> ev.Stream:
        k = (c.id, store, name)
        if k not in self._live:
            d = getattr(c, store)
            cfg = (self.config.evidence_for(c.lever, name) if store == "streams"
                   else self.config.probation_evidence(c.lever))
            self._live[k] = (ev.Stream.from_dict(d[name]) if d.get(name) else
                             ev.Stream.start(self.config.nulls(), components=cfg.components()))
            d.setdefault(name, {})  # marks it present; written by _flush
        return self._live[k]

    def _flush(self) -> None:
        for (cid, store, name), s in self._live.items():
            getattr(self.get(cid), store)[name] = s.to_dict()

    def stream(self, c: Candidate, store: str, name: str) -> ev.Stream:
        """The candidate's evidence stream ``name`` (``store``: "streams", or "probation" since the accept)."""
        if store not in ("streams", "probation"):
            raise LedgerError(f"no evidence store {store!r}: 'streams' or 'probation'")
        return self._stream(c, store, name)

    def streams(self, c: Candidate, store: str = "streams") -> list[ev.Stream]:
        return [self._stream(c, store, name) for name in list(getattr(c, store))]

    def add_evidence(self, cid: str, stream: str, x, lo, hi, units: Sequence[str],
                     subjects: Sequence[str] | None = None) -> int:
        """Feed observations ``x`` (bounds ``lo``/``hi``, fixed before each was seen) from ``units``
        (one id each: a run, a replayed task and night) to the candidate's ``stream``, and to its
        probation stream when accepted. ``subjects``: what each unit is about (the task of a replay),
        when it differs from the unit. Refuses a unit or subject the candidate was selected on, or a
        unit already judged on in this stream. Returns how many were added."""
        c = self.get(cid)
        if c.state in ("reverted", "dropped"):
            raise LedgerError(f"candidate {cid} is {c.state}: it takes no more evidence")
        x = np.asarray(x, dtype=np.float64).ravel()
        units = [str(u) for u in units]
        if len(units) != len(x):
            raise LedgerError(f"candidate {cid}: {len(x)} observations but {len(units)} unit ids")
        if subjects is not None and len(subjects) != len(units):
            raise LedgerError(f"candidate {cid}: {len(units)} units but {len(subjects)} subjects")
        bad = sorted((set(units) | set(map(str, subjects or ()))) & self.selected(c))
        if bad:
            raise LedgerError(f"candidate {cid}: {len(bad)} unit(s) its proposal was selected on (e.g. {bad[0]!r}) "
                              "cannot be its evidence; judge it on tasks or runs its proposal never looked at")
        seen = set(c.judged_on.get(stream, ()))
        dup = [u for u in units if u in seen]
        if dup or len(set(units)) != len(units):
            raise LedgerError(f"candidate {cid}: unit {(dup or units)[0]!r} already counted in stream {stream!r}")
        if not len(x):
            return 0
        cfg = self.config.evidence_for(c.lever, stream)
        self._stream(c, "streams", stream).feed(x, lo, hi, cfg)
        if c.state == "accepted":
            self._stream(c, "probation", stream).feed(x, lo, hi, self.config.probation_evidence(c.lever))
        c.judged_on.setdefault(stream, []).extend(units)
        return len(x)

    def standing(self, cid: str, only: Sequence[str] | None = None) -> dict:
        """Where the candidate's evidence stands: the estimate and confidence sequence (level alpha_j),
        the one-sided lower bound the accept reads (the smallest gain K+ has not rejected at 1/alpha_j),
        K+(0) against "no gain" and the 1/alpha_j it needs, and on probation K-(min_useful_gain).
        ``only``: the streams to read (a lever whose baseline changed reads only the streams against the
        new one); default all."""
        c = self.get(cid)
        cfg = self.config
        nulls = cfg.nulls()
        out = {"evidence": 1.0, "needed": 1.0 / c.alpha, "estimate": None, "ci": (None, None), "n": 0,
               "lower_one_sided": None, "revert_evidence": None, "revert_needed": 1.0 / cfg.revert_alpha}
        streams = [self._stream(c, "streams", n) for n in c.streams if only is None or n in only]
        if streams:
            lp, lm = ev.combined(streams)
            lo, hi, centre = ev.confidence_sequence(nulls, lp, lm, c.alpha)
            out.update(evidence=float(math.exp(min(lp[0, ev.at(nulls, 0.0)], 700))), estimate=float(centre[0]),
                       ci=(None if math.isnan(lo[0]) else float(lo[0]), None if math.isnan(hi[0]) else float(hi[0])),
                       n=int(sum(s.n[0] for s in streams)), upper_below_min=bool(hi[0] < cfg.min_useful_gain))
            out["drop_evidence"] = float(math.exp(min(lm[0, ev.at(nulls, cfg.min_useful_gain)], 700)))
            out["drop_needed"] = 1.0 / cfg.drop_alpha
            kept = lp[0] < math.log(1.0 / c.alpha)
            out["lower_one_sided"] = float(nulls[kept].min()) if kept.any() else None
        if c.state == "accepted" and c.probation:
            ps = self.streams(c, "probation")
            lp, lm = ev.combined(ps)
            out["revert_evidence"] = float(math.exp(min(lm[0, ev.at(nulls, cfg.min_useful_gain)], 700)))
            out["probation_n"] = int(sum(s.n[0] for s in ps))
        return out

    def decide(self, cid: str, night: str, pending_nights: int | None = None,
               only: Sequence[str] | None = None) -> str | None:
        """Apply the decision rule to one candidate after tonight's evidence (``only``: as in
        :meth:`standing`); records the night's row. Returns the new state when it changed, else None."""
        c = self.get(cid)
        st = self.standing(cid, only)
        cfg = self.config
        new, reason = None, ""
        if c.state == "pending":
            nights = pending_nights if pending_nights is not None else len({r.night for r in c.nights} | {night})
            if st["evidence"] >= st["needed"]:
                new, reason = "accepted", (f"evidence {st['evidence']:.1f} reached the {st['needed']:.0f} its level "
                                           f"alpha_{c.index} = {c.alpha:.3g} needs (estimate {st['estimate']:+.3f})")
            elif st.get("drop_evidence", 1.0) >= st.get("drop_needed", math.inf):
                new, reason = "dropped", (f"its gain is shown below the minimum useful gain {cfg.min_useful_gain} "
                                          f"(evidence {st['drop_evidence']:.1f} of the {st['drop_needed']:.0f} a drop "
                                          f"needs; estimate {st['estimate']:+.3f}): it cannot be worth it")
            elif nights >= cfg.max_pending_nights:
                new, reason = "dropped", (f"pending {nights} nights without resolving (evidence {st['evidence']:.1f} "
                                          f"of {st['needed']:.0f}); its evidence stays in the ledger")
        elif c.state == "accepted" and st["revert_evidence"] is not None:
            if st["revert_evidence"] >= st["revert_needed"]:
                new, reason = "reverted", (f"on probation its gain is excluded above {cfg.min_useful_gain}: evidence "
                                           f"{st['revert_evidence']:.1f} reached {st['revert_needed']:.0f}")
        if new:
            self.transition(cid, new, night=night, reason=reason)
        totals = {name: int(self._stream(c, "streams", name).n[0]) for name in c.streams}
        c.nights.append(NightRow(night=night, observations=totals, estimate=st["estimate"], ci=st["ci"],
                                 evidence=st["evidence"], needed=st["needed"],
                                 revert_evidence=st["revert_evidence"], state=c.state, note=reason))
        return new

    def summary(self) -> list[dict]:
        """One row per candidate for the UI: state, estimate and interval, evidence of needed, why."""
        rows = []
        for c in self.data.candidates:
            last = c.nights[-1] if c.nights else None
            why = next((t.reason for t in reversed(c.history)), "")
            rows.append({"id": c.id, "lever": c.lever, "key": c.key[:80], "state": c.state,
                         "estimate": last.estimate if last else None, "ci": list(last.ci) if last else [None, None],
                         "evidence": last.evidence if last else 1.0, "needed": 1.0 / c.alpha,
                         "revert_evidence": last.revert_evidence if last else None, "why": why,
                         "nights": len(c.nights)})
        return rows
