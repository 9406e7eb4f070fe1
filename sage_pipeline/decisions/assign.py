"""Randomised evidence with SAGE unchanged: each ``sage run`` is assigned, by a recorded draw of exact
probability, to an arm of every lever under test, through what SAGE reads.

**The plan** (:class:`Plan`) lists, per lever, its arms: a name, the candidate it stands for (None for
the incumbent), its probability and the environment that makes SAGE run it (``SAGE_SKILLS_ROOT`` for a
skills version, ``SAGE_MODELS_YAML`` for a ``models.yaml`` that pins the coder). Probabilities are
stored as integer thresholds out of ``2**32`` (:data:`SCALE`), so the probability a draw has is exact:
``count / 2**32``, never a float rounded in a shell.

**The draw.** For each lever independently, a uniform 32-bit integer ``u`` picks the first arm whose
cumulative threshold exceeds ``u``. Levers are drawn independently (a factorial design): two levers
may change for the same run, and each lever's effect is identified as its main effect, averaged
over the other lever's arms, because which arm a run got on one lever is independent of the other.

**Through what SAGE reads.** :func:`write_launcher` writes ``sage-run``, a POSIX shell script the
deploy puts beside ``sage.env``: it draws from ``/dev/urandom``, appends one whole line to
``assignments.jsonl`` (the plan's id, the draw id, each lever's arm and its exact probability),
exports the arm's variables and ``SAGE_TRACE_ID`` (which SAGE copies into every journal line,
``observability/structured_logger.py``), then ``exec sage run "$@"``. The join from a journal to
its draw is exact: the run's ``trace_id`` is the draw id. Every value in the script is shell-quoted.
With ``base_env`` the launcher first sets the environment of a whole deployment (``unset`` the variables
it does not set, then ``export`` its own), so one arm differs from the deployment in its lever's
variable only; with ``records_dir`` the records go to a folder other than the launcher's (a deploy keeps
them at its root, so they survive the next version). A reader joins each record to the plan that drew it
by the record's ``plan`` id (:func:`read_records`).

**The arms file** (``<data>/decisions/assignment_plan.json``, :data:`ARMS_FILE`; :class:`ArmsFile`): what
the levers' nights write for the deployment bundle to carry. It names each arm's *part*, not its
environment: the bundle copies the part in, and the deploy writes the launcher with the environment
pointing at the deployed copy (``sage_pipeline.sage.bundle``)::

    {"format": 1, "note": "why these arms",
     "levers": {"skills": [{"name": "live", "candidate": null, "probability": 0.5, "part": null},
                           {"name": "cand-skills-0003", "candidate": "skills-0003", "probability": 0.5,
                            "part": "sleep/sage_skills/versions/v0007"}],
                "coder":  [{"name": "incumbent", "candidate": null, "probability": 0.9, "part": null},
                           {"name": "pin-coder-0002", "candidate": "coder-0002", "probability": 0.1,
                            "part": "decisions/coder/pin-coder-0002.yaml"}]}}

- a lever is one of :data:`LEVER_PARTS`: ``coder`` (a part is a ``models.yaml``, exported as
  ``SAGE_MODELS_YAML``) or ``skills`` (a skills tree, exported as ``SAGE_SKILLS_ROOT``);
- an arm: ``name`` as :class:`Arm`'s (``^[a-z0-9_-]{1,64}$``, unique in its lever), ``candidate`` the
  ledger's candidate id it stands for (null for the incumbent), ``probability`` in (0, 1] (a lever's
  sum to 1 within 1e-9; the exact integer thresholds out of ``2**32`` are :func:`thresholds`'), ``part``
  a path relative to the data root (or absolute inside it), or null for *the bundle's own* part of that
  lever (its models.yaml, its skills root);
- :func:`load_arms` reads it through the guard (a regular file, no link, at most
  :data:`MAX_ARMS_BYTES`), refuses unknown fields, and resolves every part inside the data root
  (``untrusted.resolve_inside``: ``../`` past the root, an absolute path elsewhere or a link out is an
  :class:`AssignError` naming the file and the field); :func:`save_lever_arms` is how a lever's night
  writes its own lever's arms (merged with the other levers' under ``<file>.lock``, written atomically; an
  empty list removes the lever).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sage_pipeline import artifacts, untrusted

SCALE = 1 << 32
PLAN_NAME = "assignment_plan.json"
RECORDS_NAME = "assignments.jsonl"
LAUNCHER_NAME = "sage-run"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_ALLOWED_ENV = ("SAGE_SKILLS_ROOT", "SAGE_MODELS_YAML", "SAGE_RL_CHECKPOINT", "SAGE_RL_POLICY",
                "SAGE_RL_MIN_CONFIDENCE")
ARMS_FILE = PLAN_NAME  # <data>/decisions/assignment_plan.json: the arms file (see the module doc)
MAX_ARMS_BYTES = 1 << 20
# the levers whose arms a bundle carries: what a part is, and the variable SAGE reads it through
LEVER_PARTS = {"coder": ("file", "SAGE_MODELS_YAML"), "skills": ("folder", "SAGE_SKILLS_ROOT")}


class AssignError(ValueError):
    """A plan or a record the project cannot use (names the file, line and field)."""


class Arm(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9_\-]{1,64}$")
    candidate: str | None = None
    threshold: int = Field(ge=1, le=SCALE, description="this arm's probability times 2**32 (an integer)")
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if k not in _ALLOWED_ENV or not _ENV_NAME.match(k):
                raise ValueError(f"{k!r} is not a variable SAGE reads for a lever (allowed: {', '.join(_ALLOWED_ENV)})")
            if "\x00" in val:  # a newline is fine: every value is written by shlex.quote
                raise ValueError(f"{k}: a value with a NUL byte")
        return v

    @property
    def probability(self) -> float:
        return self.threshold / SCALE


class Plan(BaseModel):
    """Per lever, its arms (thresholds summing to exactly 2**32)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    levers: dict[str, tuple[Arm, ...]]
    note: str = ""

    @model_validator(mode="after")
    def _whole(self) -> Plan:
        for lever, arms in self.levers.items():
            if not re.match(r"^[a-z]{1,32}$", lever):
                raise ValueError(f"lever name {lever!r}")
            if sum(a.threshold for a in arms) != SCALE:
                raise ValueError(f"lever {lever}: the arms' thresholds sum to {sum(a.threshold for a in arms)}, "
                                 f"not 2**32 = {SCALE}")
            if len({a.name for a in arms}) != len(arms):
                raise ValueError(f"lever {lever}: two arms share a name")
        return self

    @property
    def id(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def probability(self, lever: str, arm: str) -> float:
        for a in self.levers[lever]:
            if a.name == arm:
                return a.probability
        raise AssignError(f"plan {self.id}: lever {lever} has no arm {arm!r}")


def thresholds(probabilities: Sequence[float]) -> list[int]:
    """Integer thresholds out of 2**32 for ``probabilities`` (each > 0, summing to 1 within 1e-9): the
    largest absorbs the rounding, so they sum to exactly 2**32."""
    ps = [float(p) for p in probabilities]
    if any(p <= 0 for p in ps) or abs(sum(ps) - 1.0) > 1e-9:
        raise AssignError(f"arm probabilities {ps} must each be > 0 and sum to 1")
    t = [max(1, round(p * SCALE)) for p in ps]
    t[max(range(len(t)), key=lambda i: t[i])] += SCALE - sum(t)
    return t


def make_plan(levers: dict[str, Sequence[tuple[str, str | None, float, dict[str, str]]]], note: str = "") -> Plan:
    """A plan from ``{lever: [(arm name, candidate id or None, probability, env), ...]}``."""
    out = {}
    for lever, arms in levers.items():
        ts = thresholds([a[2] for a in arms])
        out[lever] = tuple(Arm(name=a[0], candidate=a[1], threshold=t, env=dict(a[3])) for a, t in zip(arms, ts))
    return Plan(levers=out, note=note)


def draw(plan: Plan, uniforms: dict[str, int]) -> dict[str, Arm]:
    """Each lever's arm for the 32-bit integers ``uniforms`` (one per lever, in [0, 2**32))."""
    out = {}
    for lever, arms in plan.levers.items():
        u = int(uniforms[lever])
        if not 0 <= u < SCALE:
            raise AssignError(f"lever {lever}: a uniform {u} outside [0, 2**32)")
        acc = 0
        for a in arms:
            acc += a.threshold
            if u < acc:
                out[lever] = a
                break
    return out


def draw_id(uniforms: dict[str, int], salt: bytes) -> str:
    return hashlib.sha256(salt + json.dumps(uniforms, sort_keys=True).encode()).hexdigest()[:32]


def record(folder: str | os.PathLike[str], plan: Plan, arms: dict[str, Arm], did: str, at: str) -> None:
    """Append one whole line (one ``write`` on an ``O_APPEND`` descriptor) to ``assignments.jsonl``."""
    line = json.dumps({"plan": plan.id, "draw": did, "at": at,
                       "arms": {k: {"arm": a.name, "candidate": a.candidate, "threshold": a.threshold}
                                for k, a in arms.items()}}, sort_keys=True) + "\n"
    fd = os.open(Path(folder) / RECORDS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def save_plan(folder: str | os.PathLike[str], plan: Plan) -> Path:
    return artifacts.write_text(Path(folder) / PLAN_NAME, plan.model_dump_json(indent=1))


def load_plan(path: str | os.PathLike[str]) -> Plan:
    p = Path(path)
    try:
        return Plan.model_validate_json(p.read_bytes())
    except OSError as e:
        raise AssignError(f"{p}: cannot read the assignment plan ({e.strerror})") from None
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "levers"  # the whole-plan check is over the levers
        raise AssignError(f"{p}: field {field!r}: {first['msg']}") from None


def load_plans(folder: str | os.PathLike[str]) -> tuple[dict[str, Plan], list[str]]:
    """Every plan saved one folder below ``folder`` (``<folder>/*/assignment_plan.json``: the archived plans
    of a lever, the versions of a deploy root) by id, and the ones that could not be read (named)."""
    plans, bad = {}, []
    for f in sorted(Path(folder).glob(f"*/{PLAN_NAME}")):
        try:
            p = load_plan(f)
        except AssignError as e:
            bad.append(str(e))
            continue
        plans[p.id] = p
    return plans, bad


def read_records(path: str | os.PathLike[str], plans: dict[str, Plan]) -> tuple[dict[str, dict], list[str]]:
    """The draws in ``assignments.jsonl`` by draw id: ``{lever: (arm, exact probability, candidate)}``,
    each checked against its plan (``plans`` by id); and the problems, one per bad line, naming the
    file, the line and the field."""
    out, bad = {}, []
    p = Path(path)
    if not p.exists():
        return out, bad
    for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            r = json.loads(line)
            plan = plans[r["plan"]]
            levers = {}
            for lever, a in r["arms"].items():
                arm = next(x for x in plan.levers[lever] if x.name == a["arm"])
                if int(a["threshold"]) != arm.threshold:
                    raise ValueError("threshold")
                levers[lever] = {"arm": arm.name, "probability": arm.probability, "candidate": arm.candidate}
            out[str(r["draw"])] = {"plan": plan.id, "at": r.get("at"), "levers": levers}
        except json.JSONDecodeError:
            bad.append(f"{p}:{i}: not JSON")
        except KeyError as e:
            bad.append(f"{p}:{i}: field {e.args[0]!r} missing or unknown (plan, lever or arm)")
        except (StopIteration, ValueError, TypeError, AttributeError) as e:
            bad.append(f"{p}:{i}: an arm that does not match its plan ({e})")
    return out, bad


def launcher_text(plan: Plan, records_dir: str | os.PathLike[str], sage: str = "sage",
                  base_env: Mapping[str, str] | None = None, unset: Sequence[str] = ()) -> str:
    """The text of ``sage-run`` for ``plan`` (see the module doc): ``unset`` then ``base_env``'s exports
    (the deployment), each lever's draw and its arm's exports, the record appended to
    ``records_dir/assignments.jsonl``, ``exec sage run "$@"``."""
    base = dict(base_env or {})
    for k, v in base.items():
        if k not in _ALLOWED_ENV or "\x00" in v:
            raise AssignError(f"base environment {k}: not a variable SAGE reads for a lever, or a value with a NUL")
    for k in unset:
        if k not in _ALLOWED_ENV:
            raise AssignError(f"unset {k}: not a variable SAGE reads for a lever")
    q = shlex.quote
    lines = ["#!/bin/sh", "# written by sage_pipeline.decisions.assign: a recorded random assignment per sage run",
             "set -eu", f"here={q(os.path.abspath(records_dir))}",
             "u32() { od -An -N4 -tu4 /dev/urandom | tr -d ' \\n'; }", "at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"]
    lines += [f"unset {k}" for k in unset]
    lines += [f"export {k}={q(v)}" for k, v in base.items()]
    arms_json = []
    for lever, arms in plan.levers.items():
        lines.append(f"u_{lever}=$(u32)")
        acc = 0
        cond = "if"
        for a in arms:
            acc += a.threshold
            exports = " ".join(f"export {k}={q(v)};" for k, v in sorted(a.env.items())) or ":;"
            cand = "null" if a.candidate is None else json.dumps(a.candidate)
            entry = f'"{lever}":{{"arm":"{a.name}","candidate":{cand},"threshold":{a.threshold}}}'
            if len(arms) == 1:  # a lever with one arm (probability 1): no test
                lines.append(f"{exports} a_{lever}={q(entry)}")
                break
            test = "else" if acc == SCALE else f"{cond} [ \"$u_{lever}\" -lt {acc} ]; then"
            lines.append(f"{test} {exports} a_{lever}={q(entry)}")
            cond = "elif"
        else:
            lines.append("fi")
        arms_json.append(f"$a_{lever}")
    uni = ",".join(f'\\"{lever}\\":$u_{lever}' for lever in plan.levers)
    lines += [
        f"draw=$(printf '%s %s %s' \"{{{uni}}}\" \"$at\" \"$$$(u32)\" | sha256sum | cut -c1-32)",
        "export SAGE_TRACE_ID=\"$draw\"",
        f"line=\"{{\\\"arms\\\": {{{','.join(arms_json)}}}, \\\"at\\\": \\\"$at\\\", \\\"draw\\\": \\\"$draw\\\", "
        f"\\\"plan\\\": \\\"{plan.id}\\\"}}\"",
        f"printf '%s\\n' \"$line\" >> \"$here/{RECORDS_NAME}\"",
        f"exec {q(sage)} run \"$@\"",
    ]
    return "\n".join(lines) + "\n"


def write_launcher(folder: str | os.PathLike[str], plan: Plan, sage: str = "sage", *,
                   records_dir: str | os.PathLike[str] | None = None, base_env: Mapping[str, str] | None = None,
                   unset: Sequence[str] = ()) -> Path:
    """``folder/sage-run``: draw, record, export, ``exec sage run "$@"`` (see the module doc), its records
    in ``records_dir`` (default ``folder``). Written atomically (only when its text changes) and made
    executable; the plan is saved beside it."""
    folder = Path(folder)
    text = launcher_text(plan, (folder.resolve() if records_dir is None else Path(records_dir)), sage,
                         base_env, unset)
    if not (folder / PLAN_NAME).is_file() or (folder / PLAN_NAME).read_text(encoding="utf-8") != \
            plan.model_dump_json(indent=1):
        save_plan(folder, plan)
    path = folder / LAUNCHER_NAME
    try:
        same = path.read_text(encoding="utf-8") == text and os.access(path, os.X_OK)
    except (OSError, UnicodeDecodeError):
        same = False
    if not same:
        path = artifacts.write_text(path, text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ------------------------------------------------------------------------------------- the arms file
class ArmSpec(BaseModel):
    """One arm of the arms file (see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    name: str = Field(pattern=r"^[a-z0-9_\-]{1,64}$")
    candidate: str | None = Field(None, min_length=1, max_length=200)
    probability: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    part: str | None = Field(None, description="a path inside the data root; null: the bundle's own part")


class ArmsFile(BaseModel):
    """``<data>/decisions/assignment_plan.json``: per lever, the arms and their parts (see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    format: Literal[1] = 1
    note: str = ""
    levers: dict[str, list[ArmSpec]] = Field(default_factory=dict)

    @field_validator("levers")
    @classmethod
    def _levers(cls, v: dict[str, list[ArmSpec]]) -> dict[str, list[ArmSpec]]:
        for lever, arms in v.items():
            if lever not in LEVER_PARTS:
                raise ValueError(f"lever {lever!r}: a bundle carries arms of {', '.join(LEVER_PARTS)} only")
            if not arms:
                raise ValueError(f"lever {lever}: no arms (leave the lever out instead)")
            if len({a.name for a in arms}) != len(arms):
                raise ValueError(f"lever {lever}: two arms share a name")
            total = sum(a.probability for a in arms)
            if abs(total - 1.0) > 1e-9:
                raise ValueError(f"lever {lever}: the arms' probabilities sum to {total!r}, not 1")
        return v


def _arms_error(p: Path, e: ValidationError) -> AssignError:
    first = e.errors(include_url=False)[0]
    field = ".".join(str(x) for x in first["loc"]) or "<document>"
    return AssignError(f"{p}: field {field!r}: {first['msg']} ({len(e.errors())} error(s)); the arms file is "
                       "written by the levers' nights (assign.save_lever_arms): write it again")


def load_arms(path: str | os.PathLike[str], data_root: str | os.PathLike[str]
              ) -> dict[str, list[tuple[str, str | None, float, Path | None]]]:
    """The arms file at ``path`` as ``{lever: [(name, candidate, probability, part or None)]}`` (what
    ``bundle.build(arms=...)`` takes), each part resolved inside ``data_root``; an :class:`AssignError`
    names the file, the field and what is wrong (see the module doc)."""
    p = Path(path)
    try:
        raw = untrusted.read_bytes(p.parent, p.name, MAX_ARMS_BYTES)
    except untrusted.Untrusted as e:
        raise AssignError(f"the arms file: {e}") from None
    try:
        doc = ArmsFile.model_validate_json(raw)
    except ValidationError as e:
        raise _arms_error(p, e) from None
    out: dict[str, list[tuple[str, str | None, float, Path | None]]] = {}
    for lever, arms in doc.levers.items():
        out[lever] = []
        for i, a in enumerate(arms):
            part = None
            if a.part is not None:
                try:
                    part = untrusted.resolve_inside(data_root, a.part)
                except untrusted.Untrusted as e:
                    raise AssignError(f"{p}: field 'levers.{lever}.{i}.part' ({a.part!r}): {e}") from None
            out[lever].append((a.name, a.candidate, a.probability, part))
    return out


def read_arms_file(path: str | os.PathLike[str]) -> ArmsFile:
    """The arms file as written (no part resolved); a missing file is an empty one."""
    p = Path(path)
    if not p.exists():
        return ArmsFile()
    try:
        return ArmsFile.model_validate_json(untrusted.read_bytes(p.parent, p.name, MAX_ARMS_BYTES))
    except untrusted.Untrusted as e:
        raise AssignError(f"the arms file: {e}") from None
    except ValidationError as e:
        raise _arms_error(p, e) from None


def save_lever_arms(path: str | os.PathLike[str], lever: str,
                    arms: Sequence[tuple[str, str | None, float, str | None]], note: str = "") -> Path:
    """Write ``lever``'s arms (``(name, candidate, probability, part path inside the data root or None)``;
    none: the lever is removed) into the arms file at ``path``, keeping every other lever's as the file has
    them now, under ``<path>.lock``, atomically."""
    import filelock

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(p) + ".lock"):
        old = read_arms_file(p)
        levers = {k: list(v) for k, v in old.levers.items() if k != lever}
        if arms:
            levers[lever] = [ArmSpec(name=a[0], candidate=a[1], probability=float(a[2]),
                                     part=None if a[3] is None else str(a[3])) for a in arms]
        try:
            doc = ArmsFile(note=note or old.note, levers=levers)
        except ValidationError as e:
            raise _arms_error(p, e) from None
        return artifacts.write_text(p, doc.model_dump_json(indent=1))
