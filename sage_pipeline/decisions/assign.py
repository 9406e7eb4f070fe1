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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sage_pipeline import artifacts

SCALE = 1 << 32
PLAN_NAME = "assignment_plan.json"
RECORDS_NAME = "assignments.jsonl"
LAUNCHER_NAME = "sage-run"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_ALLOWED_ENV = ("SAGE_SKILLS_ROOT", "SAGE_MODELS_YAML", "SAGE_RL_CHECKPOINT", "SAGE_RL_POLICY",
                "SAGE_RL_MIN_CONFIDENCE")


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
            if "\x00" in val or "\n" in val:
                raise ValueError(f"{k}: a value with a NUL or a newline")
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


def write_launcher(folder: str | os.PathLike[str], plan: Plan, sage: str = "sage") -> Path:
    """``folder/sage-run``: draw, record, export, ``exec sage run "$@"`` (see the module doc). Written
    atomically and made executable; the plan is saved beside it."""
    folder = Path(folder)
    save_plan(folder, plan)
    q = shlex.quote
    lines = ["#!/bin/sh", "# written by sage_pipeline.decisions.assign: a recorded random assignment per sage run",
             "set -eu", f"here={q(str(folder.resolve()))}",
             "u32() { od -An -N4 -tu4 /dev/urandom | tr -d ' \\n'; }", "at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"]
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
            test = "else" if acc == SCALE else f"{cond} [ \"$u_{lever}\" -lt {acc} ]; then"
            lines.append(f"{test} {exports} a_{lever}={q(entry)}")
            cond = "elif"
        lines.append("fi")
        arms_json.append(f"$a_{lever}")
    uni = ",".join(f'\\"{lever}\\":$u_{lever}' for lever in plan.levers)
    lines += [
        f"draw=$(printf '%s %s %s' \"{{{uni}}}\" \"$at\" \"$$$(u32)\" | sha256sum | cut -c1-32)",
        "export SAGE_TRACE_ID=\"$draw\"",
        f"line=\"{{\\\"arms\\\": {{{','.join(arms_json)}}}, \\\"at\\\": \\\"$at\\\", \\\"draw\\\": \\\"$draw\\\", "
        f"\\\"plan\\\": \\\"{plan.id}\\\"}}\"",
        "printf '%s\\n' \"$line\" >> \"$here/assignments.jsonl\"",
        f"exec {q(sage)} run \"$@\"",
    ]
    path = artifacts.write_text(folder / LAUNCHER_NAME, "\n".join(lines) + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
