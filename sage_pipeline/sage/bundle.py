"""Every lever SAGE runs unchanged, as one deployment bundle, switched atomically.

SAGE's outcomes change only through what it reads (docs/architecture.md, "Serving back to SAGE"):

* ``models.yaml`` through ``SAGE_MODELS_YAML`` (``config/paths.py``): every role's primary, fallback and
  triggers, the coder's included (its UCB bandit chooses between the coder's two models);
* the router checkpoint through ``SAGE_RL_POLICY=1``, ``SAGE_RL_CHECKPOINT`` and
  ``SAGE_RL_MIN_CONFIDENCE`` (``rl/policy.py``; never the coder);
* the skills tree through ``SAGE_SKILLS_ROOT`` (``prompt_engine/skill_injector.py``);
* the coder's bandit state, ``memory/rl/ucb_bandit.json`` in each workspace (:mod:`.bandit_state`).

A **bundle** is a folder holding those parts and ``bundle.json``: each part's file and sha256, the
table the bundle was learned for (the one SAGE ran when its logs were written: a bundle is bound to
it), the objective it was chosen under, its exploration, and why. Its id is the sha256 of its parts.

It may also carry what decided it and the random assignment that keeps testing it (issue 47):

* ``decisions``: the decision ledger (``ledger.json``, :mod:`sage_pipeline.decisions.ledger`), read with
  ``Ledger.load``'s schema, so the ledger is stored atomically with the bundle it decided;
* ``arms``: per lever under test (``coder``: a ``models.yaml``; ``skills``: a skills tree;
  ``assign.LEVER_PARTS``), its arms as the plan draws them: a name, the ledger candidate it stands for,
  its exact probability as an integer threshold out of ``2**32``, and its part at the fixed name
  ``arms/<lever>/<arm>/models.yaml`` or ``arms/<lever>/<arm>/skills/`` (or none: the arm runs the bundle's
  own part of that lever). A ``models.yaml`` arm must route every role but the coder as ``learned_for``
  and the bundle's table do (an arm changes its lever only).

Both enter the id (with their sha256s, and the arms' names, candidates and thresholds); a bundle with
neither keeps the id it always had.

**Reading** a bundle (:func:`read`; every deploy does it first) treats it as hostile: it may come from
another machine or a manifest edited by hand. Nothing is taken on the manifest's word:

* ``bundle.json`` is read through the guard (:mod:`sage_pipeline.untrusted`: a regular file, no link,
  at most :data:`MAX_MANIFEST_BYTES`) and validated by one typed schema (:class:`Manifest`, strict: a
  string where a number belongs is an error, never converted). **Unknown fields are refused** at every
  level but inside ``exploration`` (free-form, for people): only :func:`build` writes a manifest, so a
  field this version does not know is a hand edit or another format, and ignoring it would deploy a
  bundle whose author thought it said more. An error names the file, the field (pydantic's ``loc``)
  and what to do;
* each part sits at its own fixed name in the bundle (``models.yaml``, ``checkpoint/``,
  ``ucb_bandit.json``, ``skills/``, ``ledger.json``, ``arms/<lever>/<arm>/...``; an absolute or ``../``
  path is refused by the schema) and is a regular file or a folder with no link anywhere in it or on the
  way to it (not even to a file inside the bundle), nothing but folders and regular files under it,
  every file read through the guard
  (:data:`MAX_FILE_BYTES` each, :data:`MAX_PART_FILES` and :data:`MAX_BUNDLE_BYTES` in all);
* every part's sha256 is recomputed from its contents and compared, and the **id is recomputed** from
  them: a manifest whose ``id`` differs is refused, naming both. Only the recomputed id is ever used
  (as the version's folder name, in the env file, in the record);
* ``learned_for`` must hash to its ``routing_sha256`` and parse as a table; ``models.yaml`` must parse
  as SAGE's table; the checkpoint's ``policy.joblib`` must have the sha256 its ``manifest.json`` (and
  the bundle's manifest) says and be written for the bundle's table; the bandit state must read as
  SAGE's; the skills (and every skills arm) must hold a ``SKILL.md``; the ledger must load as the
  ledger (a :class:`~sage_pipeline.decisions.ledger.LedgerError` is a BundleError naming the file and
  field); every ``models.yaml`` arm must parse as SAGE's table and be bound to ``learned_for`` as above;
  every lever's thresholds must sum to exactly ``2**32``.

The id is a content hash, not a signature: anyone can compute it. A bundle whose parts are all
consistent still carries a pickle (``policy.joblib``) that SAGE loads with joblib: deploy bundles from
machines you trust.

**Deploying** (:func:`deploy`, ``python -m sage_pipeline.sage.bundle deploy``) to a root folder writes
nothing until the bundle has been read as above and:

1. the target SAGE's table is read the way SAGE reads it (with ``--sage-python``, by SAGE's own
   ``ModelRouter`` under the target's environment, test profiles included), and the bundle is
   refused, naming every role and model that differ, when it is not the table the bundle was learned
   for (or the bundle's own table: deploying the same bundle twice is a no-op);

then, holding an exclusive ``flock`` on ``<root>/.locks/sage_deploy.lock`` (:func:`artifacts.exclusive`),
so deploys to one root run one at a time, whichever process or machine starts them:

2. the manifest and the parts (nothing else of the bundle folder) are copied to
   ``<root>/versions/<id>/`` (atomically, never rewritten afterwards), read back as above, and beside
   them ``sage.env``: the ``export`` lines naming that version's own files (absolute paths inside the
   version, never through ``current``: SAGE reads its parts at different moments of its run);
3. ``<root>/current`` is switched to the version: a symlink replaced in one rename. It is **the one
   switch**: ``<root>/sage.env`` is itself the link ``current/sage.env`` (made once), so opening it
   resolves ``current`` at that instant and reads the env of the very version ``current`` names. A SAGE
   started with ``. <root>/sage.env`` reads the whole of one version for its whole run, the old bundle
   or the new one, never a mix, and ``current`` and ``sage.env`` can never disagree. (A root deployed by
   an older version, with a regular ``sage.env``, is switched to the link on its next deploy, after
   the version ``current`` names is given its own ``sage.env``.)
   The env file is generated shell text: comment lines of the project's own words, ``unset NAME`` and
   ``export NAME=VALUE``, NAME matching ``^[A-Z_][A-Z0-9_]*$`` and VALUE quoted by ``shlex.quote``, so a
   deploy root whose name holds a space, a quote, ``$(...)``, a backtick or a newline is exported as
   it is and runs nothing. :func:`read_env_file` reads that grammar and refuses any other line.
   **With arms**, the version also gets ``sage-run`` (``assign.write_launcher``) and the plan it draws
   from (``assignment_plan.json``, its arms' variables naming the deployed copies in the version, never
   the bundle's folder), and ``<root>/sage-run`` is the link ``current/sage-run``, so the launcher and
   ``sage.env`` switch together. ``<root>/sage-run "<prompt>"`` replaces ``sage run "<prompt>"``: it sets
   the version's whole environment (as ``sage.env``), draws each lever's arm, appends the draw to
   ``<root>/assignments.jsonl`` (at the root, so the records of every version stay in one file across
   deploys; each names its plan's id, and :func:`deployed_plans` gives every deployed plan by id), and
   exports ``SAGE_TRACE_ID`` = the draw id. A root that once had a launcher keeps one: a version without
   arms gets a launcher that draws nothing (its records have no arms), so ``<root>/sage-run`` never
   dangles;
4. the bandit state, when the bundle has one, is written into each workspace named (atomically per
   file; the workspace's ``memory/rl`` must resolve inside it, checked before anything is written). It
   is not part of the switch: SAGE reads it once when it starts and rewrites it after every verdict, so
   it is the workspace's own memory, and a SAGE already running in that workspace overwrites it;
   deploy to workspaces no SAGE is running in;
5. the deployment is recorded: one JSON line appended to ``<root>/deployments.jsonl`` (bundle id, time,
   parts; with a launcher, its path and the plan's id) with one ``O_APPEND`` write and an fsync, never
   rewritten, and the checkpoint in the routing
   dataset's deployments record (``explore.record_deployment``), so every decision SAGE logs from then
   on gets its exact probability back.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from sage_pipeline import artifacts, untrusted
from sage_pipeline.decisions import assign
from sage_pipeline.decisions.ledger import LEDGER_NAME, Ledger, LedgerError
from sage_pipeline.sage import bandit_state, checkpoint as ck, explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable

FORMAT = 1
MANIFEST = "bundle.json"
MODELS_YAML = "models.yaml"
CHECKPOINT_DIR = "checkpoint"
BANDIT_FILE = "ucb_bandit.json"
SKILLS_DIR = "skills"
LEDGER_FILE = LEDGER_NAME  # ledger.json: the decisions part
ARMS_DIR = "arms"  # arms/<lever>/<arm>/<models.yaml | skills>
ARM_PART = {"coder": MODELS_YAML, "skills": SKILLS_DIR}  # each lever's part name (assign.LEVER_PARTS: its kind)
LAUNCHER = assign.LAUNCHER_NAME  # sage-run, in each version with arms; <root>/sage-run -> current/sage-run
ASSIGNMENTS = assign.RECORDS_NAME  # <root>/assignments.jsonl
ENV_FILE = "sage.env"
RECORD = "deployments.jsonl"
CURRENT = "current"
VERSIONS_DIR = "versions"
LOCK_NAME = "sage_deploy"  # <root>/.locks/sage_deploy.lock
# each part: its fixed name in the bundle and whether it is a file or a folder
PARTS = {"models_yaml": (MODELS_YAML, "file"), "checkpoint": (CHECKPOINT_DIR, "folder"),
         "bandit_state": (BANDIT_FILE, "file"), "skills": (SKILLS_DIR, "folder"),
         "decisions": (LEDGER_FILE, "file")}
_ID_PARTS = ("models_yaml", "checkpoint", "bandit_state", "skills")  # always in the id (None when absent)
_OPTIONAL = ("decisions",)  # in the manifest and the id only when present: older bundles keep their id
MAX_MANIFEST_BYTES = 1 << 20  # bundle.json, a checkpoint's manifest.json, an env file
MAX_FILE_BYTES = 256 << 20  # one file of a part (a policy.joblib is a few MB)
MAX_PART_FILES = 10_000
MAX_BUNDLE_BYTES = 1 << 30
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*", re.ASCII)
ROUTER_VARS = ("SAGE_RL_POLICY", "SAGE_RL_CHECKPOINT", "SAGE_RL_MIN_CONFIDENCE", "SAGE_SKILLS_ROOT")
REBUILD = ("build the bundle again with sage_pipeline (make run writes datasets/checkpoints/bundle) instead of "
           "editing it by hand")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class BundleError(ValueError):
    """A bundle that cannot be built, read or deployed; the message says what and what to do."""


class BundleRefused(BundleError):
    """The target SAGE runs another table than the one the bundle was learned for."""

    def __init__(self, bundle: str, target: str, differences: list[str]) -> None:
        self.differences = differences
        super().__init__(
            f"bundle {bundle} was learned for another table than the one SAGE runs ({target}): "
            + "; ".join(differences) + ". Deploying it would change SAGE's behaviour in ways nobody measured. "
            "Fix: run the chain on the journals of the SAGE you deploy to (its table), or point that SAGE at the "
            "bundle's table first (SAGE_MODELS_YAML).")


# --- the manifest's one shape --------------------------------------------------------------------------

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelsYamlPart(_Strict):
    path: Literal["models.yaml"] = Field(description="always models.yaml, in the bundle's folder")
    sha256: Sha256


class CheckpointPart(_Strict):
    path: Literal["checkpoint"] = Field(description="always checkpoint/, in the bundle's folder")
    sha256: Sha256
    min_confidence: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="SAGE_RL_MIN_CONFIDENCE")
    kind: str | None = None
    policy_sha256: Sha256 | None = Field(None, description="policy.joblib's sha256, as its manifest.json says")


class BanditPart(_Strict):
    path: Literal["ucb_bandit.json"]
    sha256: Sha256


class SkillsPart(_Strict):
    path: Literal["skills"]
    sha256: Sha256


class DecisionsPart(_Strict):
    path: Literal["ledger.json"] = Field(description="always ledger.json: the decision ledger")
    sha256: Sha256


class Parts(_Strict):
    models_yaml: ModelsYamlPart
    checkpoint: CheckpointPart | None = None
    bandit_state: BanditPart | None = None
    skills: SkillsPart | None = None
    decisions: DecisionsPart | None = None


def arm_path(lever: str, arm: str) -> str:
    """An arm's part's fixed name in the bundle: ``arms/<lever>/<arm>/<models.yaml | skills>``."""
    return f"{ARMS_DIR}/{lever}/{arm}/{ARM_PART[lever]}"


class ArmEntry(_Strict):
    """One arm of a lever under test: ``threshold / 2**32`` is its exact probability."""

    name: str = Field(pattern=r"^[a-z0-9_\-]{1,64}$")
    candidate: str | None = Field(None, description="the ledger's candidate id; null for the incumbent")
    threshold: int = Field(ge=1, le=assign.SCALE)
    path: str | None = Field(None, description="arm_path(lever, name), or null: the bundle's own part")
    sha256: Sha256 | None = None


class LearnedFor(_Strict):
    """The table the bundle was learned for (:func:`checkpoint.table_digest`)."""

    path: str
    sha256: Sha256 | None = None
    routing_sha256: Sha256
    roles: list[str]
    routing: dict[str, dict[str, Any]]


class Manifest(_Strict):
    """``bundle.json``: every field typed, unknown fields refused (see the module doc)."""

    format: Literal[1]
    id: str = Field(description="the sha256 of the parts' sha256s; recomputed on every read, never trusted")
    created: str
    parts: Parts
    learned_for: LearnedFor
    objective: TaskObjective
    exploration: dict[str, Any] | None = None
    why: str = ""
    arms: dict[str, list[ArmEntry]] | None = Field(None, description="per lever under test, its arms "
                                                   "(checked whole by _check_arms)")


def _check_arms(path: Path, arms: dict[str, list[ArmEntry]]) -> None:
    """The manifest's arms as only :func:`build` writes them, each problem naming its field."""
    for lever, entries in arms.items():
        if lever not in ARM_PART:
            raise BundleError(f"{path}: field 'arms.{_short(lever)}': a bundle carries arms of "
                              f"{', '.join(ARM_PART)} only: {REBUILD}")
        if not entries or len({a.name for a in entries}) != len(entries):
            raise BundleError(f"{path}: field 'arms.{lever}': no arms, or two arms sharing a name: {REBUILD}")
        total = sum(a.threshold for a in entries)
        if total != assign.SCALE:
            raise BundleError(f"{path}: field 'arms.{lever}': the thresholds sum to {total}, not 2**32 = "
                              f"{assign.SCALE} (each arm's probability is its threshold / 2**32): {REBUILD}")
        for i, a in enumerate(entries):
            if a.path is not None and a.path != arm_path(lever, a.name):
                raise BundleError(f"{path}: field 'arms.{lever}.{i}.path' is {_short(a.path)}, it must be "
                                  f"{arm_path(lever, a.name)!r} (or null: the bundle's own part): {REBUILD}")
            if (a.path is None) != (a.sha256 is None):
                raise BundleError(f"{path}: field 'arms.{lever}.{i}.sha256': a path needs its sha256 and a sha256 "
                                  f"its path: {REBUILD}")


def _ident(part_sha: dict[str, str | None], arms: dict[str, list[dict]] | None = None) -> str:
    """The bundle's id: the sha256 of its parts' sha256s (None for a part it does not have; the ledger only
    when present) and, with arms, each lever's arms in draw order (name, candidate, threshold, sha256)."""
    doc: dict[str, Any] = {k: part_sha.get(k) for k in _ID_PARTS}
    doc |= {k: part_sha[k] for k in _OPTIONAL if part_sha.get(k) is not None}
    if arms:
        doc["arms"] = {lever: [[a["name"], a.get("candidate"), a["threshold"], a.get("sha256")] for a in entries]
                       for lever, entries in arms.items()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Bundle:
    """A bundle :func:`read` has verified: ``manifest`` validated, ``id`` recomputed from the parts."""

    folder: Path
    manifest: dict
    id: str

    def part(self, name: str) -> Path | None:
        return None if self.manifest["parts"].get(name) is None else self.folder / PARTS[name][0]

    @property
    def table(self) -> RoutingTable:
        return RoutingTable.load(self.folder / MODELS_YAML)

    @property
    def learned_for(self) -> RoutingTable:
        return RoutingTable.from_dict({"routing": self.manifest["learned_for"]["routing"]},
                                      source=self.manifest["learned_for"]["path"])

    def env(self, folder: Path | None = None) -> dict[str, str]:
        """The environment that makes SAGE run this bundle from ``folder`` (default: its own)."""
        base = Path(os.path.abspath(folder or self.folder))
        out = {"SAGE_MODELS_YAML": str(base / MODELS_YAML)}
        cp = self.manifest["parts"].get("checkpoint")
        if cp is not None:
            out |= {"SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(base / CHECKPOINT_DIR / ck.JOBLIB_NAME),
                    "SAGE_RL_MIN_CONFIDENCE": repr(float(cp["min_confidence"]))}
        if self.manifest["parts"].get("skills") is not None:
            out["SAGE_SKILLS_ROOT"] = str(base / SKILLS_DIR)
        return out

    @property
    def arms(self) -> dict[str, list[dict]]:
        """Per lever under test, its arms as the manifest holds them (empty: none)."""
        return self.manifest.get("arms") or {}

    def plan(self, folder: Path | None = None) -> assign.Plan | None:
        """The assignment plan of this bundle's arms run from ``folder`` (default: its own), None without
        arms: each arm's variable names its part inside ``folder``; an arm without a part sets nothing (the
        bundle's own part of that lever runs). The note names the bundle, so each bundle's plan has its id."""
        if not self.arms:
            return None
        base = Path(os.path.abspath(folder or self.folder))
        levers = {lever: tuple(assign.Arm(name=a["name"], candidate=a["candidate"], threshold=a["threshold"],
                                          env={} if a["path"] is None else
                                          {assign.LEVER_PARTS[lever][1]: str(base / a["path"])})
                               for a in entries)
                  for lever, entries in self.arms.items()}
        return assign.Plan(levers=levers, note=f"bundle {self.id}")


# --- a part's files, through the guard -----------------------------------------------------------------


def _part_files(root: Path, rel: str, kind: str) -> list[Path]:
    """The files of the part at ``root/rel`` (``root`` resolved; ``kind`` "file" or "folder"), sorted as its
    hash takes them.
    Raises :class:`untrusted.Untrusted` for a link anywhere (even to a file inside ``root``) or anything but
    folders and regular files, BundleError past :data:`MAX_PART_FILES` files, FileNotFoundError when
    missing."""
    where = root / rel
    on_the_way = root
    for name in Path(rel).parts[:-1]:  # arms/<lever>/<arm>/...: every folder on the way is a folder, not a link
        on_the_way = on_the_way / name
        st = os.lstat(on_the_way)
        if not stat.S_ISDIR(st.st_mode):
            raise untrusted.Untrusted(on_the_way, root, "link" if stat.S_ISLNK(st.st_mode) else "not_regular",
                                      f"it is {untrusted.kind_of(st.st_mode)} on the way to the part {rel}: "
                                      "a folder on the way to a part is a folder")
    st = os.lstat(where)
    if stat.S_ISLNK(st.st_mode):
        raise untrusted.Untrusted(where, root, "link", f"it points at {os.readlink(where)!r}; a part is never a link")
    want = stat.S_ISREG if kind == "file" else stat.S_ISDIR
    if not want(st.st_mode):
        raise untrusted.Untrusted(where, root, "not_regular",
                                  f"it is {untrusted.kind_of(st.st_mode)}, the part is a {kind}")
    if kind == "file":
        return [where]
    files = []
    for p, reason in untrusted.walk_files(root, rel):
        if reason is not None:
            raise untrusted.Untrusted(p, root, reason)
        if os.path.islink(p):  # walk_files lets a link to a regular file inside the root through: a part may not
            raise untrusted.Untrusted(p, root, "link", f"it points at {os.readlink(p)!r}; nothing in a part is a link")
        files.append(p)
        if len(files) > MAX_PART_FILES:
            raise BundleError(f"{where}: more than {MAX_PART_FILES} files: not a bundle part (a checkpoint is two "
                              "files, a skills root a few dozen)")
    return sorted(files)


def _rel(where: Path, f: Path) -> str:
    return f.name if f == where else str(f.relative_to(where))


def _chunks(fh: Any, f: Path, root: Path) -> Iterator[bytes]:
    n = 0
    while block := fh.read(1 << 20):
        n += len(block)
        if n > MAX_FILE_BYTES:
            raise untrusted.Untrusted(f, root, "too_large",
                                      f"it grew past the cap of {MAX_FILE_BYTES} bytes while read")
        yield block


def _hash_part(root: Path, rel: str, files: list[Path], budget: int = MAX_BUNDLE_BYTES
               ) -> tuple[str, dict[str, str], int]:
    """(the part's sha256, each file's sha256 by its path in the part, bytes read; more than ``budget`` is
    a BundleError). The part's hash is the sha256 over its files in order of (path, NUL, file sha256, NUL)."""
    where, h, shas, total = root / rel, hashlib.sha256(), {}, 0
    for f in files:
        fh_sha = hashlib.sha256()
        with untrusted.open_binary(root, f, MAX_FILE_BYTES) as fh:
            for block in _chunks(fh, f, root):
                fh_sha.update(block)
                total += len(block)
                if total > budget:
                    raise BundleError(f"{where}: the bundle's parts hold more than {MAX_BUNDLE_BYTES} bytes: not a "
                                      "bundle (a checkpoint and a skills root are a few MB)")
        rel_f = _rel(where, f)
        shas[rel_f] = fh_sha.hexdigest()
        h.update(os.fsencode(rel_f) + b"\0")
        h.update(shas[rel_f].encode() + b"\0")
    return h.hexdigest(), shas, total


def _copy_files(root: Path, rel: str, files: list[Path], target: Path) -> None:
    """The files of the part at ``root/rel``, read through the guard, written at ``target`` (the part's
    path in a fresh folder of this process)."""
    where = root / rel
    for f in files:
        out = target if f == where else target / f.relative_to(where)
        out.parent.mkdir(parents=True, exist_ok=True)
        with untrusted.open_binary(root, f, MAX_FILE_BYTES) as fh, open(out, "xb") as w:
            for block in _chunks(fh, f, root):
                w.write(block)


def _copy_tree(src: str | Path, dest: Path, what: str) -> None:
    """Copy the folder ``src`` (a checkpoint or a skills root given to :func:`build`) to ``dest``,
    refusing a link or anything but folders and regular files inside it. ``src`` itself may be a link
    (the caller's choice): it is resolved first."""
    src = Path(os.path.realpath(src))
    try:
        _copy_files(src.parent, src.name, _part_files(src.parent, src.name, "folder"), dest)
    except untrusted.Untrusted as exc:
        raise BundleError(f"{what} {src}: {exc}") from None
    except FileNotFoundError:
        raise BundleError(f"{what} {src} not found: check the path") from None


def _copy_source(src: str | Path, dest: Path, kind: str, what: str) -> Path:
    """Copy the file or folder ``src`` given to :func:`build` (the ledger, an arm's part) to ``dest``
    through the guard: ``src`` itself is never a link (nor anything in it), a FIFO is never opened.
    Returns ``src`` made absolute (for messages)."""
    src = Path(os.path.abspath(src))
    try:
        files = _part_files(src.parent, src.name, kind)
        if kind == "folder":
            dest.mkdir(parents=True, exist_ok=True)
        _copy_files(src.parent, src.name, files, dest)
    except untrusted.Untrusted as exc:
        raise BundleError(f"{what} {src}: {exc}") from None
    except FileNotFoundError:
        raise BundleError(f"{what} {src} not found: check the path") from None
    return src


def _check_ledger(path: Path, shown: Path | str) -> None:
    """The decisions part loads as the ledger (``Ledger.load``'s schema); a LedgerError is a BundleError
    naming ``shown`` and the field."""
    try:
        Ledger.load(path)
    except LedgerError as exc:
        raise BundleError(f"part 'decisions' ({shown}) is not a ledger the project wrote: "
                          f"{str(exc).replace(str(path), str(shown))}") from None


def _not_coder(table: RoutingTable) -> RoutingTable:
    return RoutingTable({r: v for r, v in table.routes.items() if r != "coder"}, source=table.source)


def _check_arm(lever: str, arm: str, where: Path, shown: str, files: list[str], table: RoutingTable,
               learned_for: RoutingTable) -> None:
    """An arm's part is what its lever reads: a ``models.yaml`` that SAGE parses and that routes every role
    but the coder as ``learned_for`` and the bundle's ``table`` do; a skills tree with a SKILL.md."""
    name = f"arms.{lever}.{arm}"
    if lever == "skills":
        if not any(Path(k).name == "SKILL.md" and len(Path(k).parts) in (2, 3) for k in files):
            raise BundleError(f"{shown}: arm {name!r} holds no <discipline>/<skill>/SKILL.md: SAGE_SKILLS_ROOT "
                              "mirrors SAGE's assets/skills/{discipline,workflow,planning}/<skill>/SKILL.md")
        return
    try:
        got = RoutingTable.load(where)
    except ValueError as exc:
        raise BundleError(f"{shown}: arm {name!r} is not a models.yaml SAGE reads: {exc}") from None
    problems = [f"against the table it was learned for: {d}" for d in
                ck.table_differences(_not_coder(learned_for), _not_coder(got))]
    problems += [f"against the bundle's models.yaml: {d}" for d in
                 ck.table_differences(_not_coder(table), _not_coder(got)) if not problems]
    if "coder" not in got.routes:
        problems.append("it routes no coder")
    if problems:
        raise BundleError(f"{shown}: arm {name!r} is a models.yaml for another table: " + "; ".join(problems)
                          + ". A coder arm changes the coder's route only: write it from the bundle's table "
                          "(sage.table.pin(learned_for, 'coder', model))")


def _hook_roles(table: RoutingTable) -> RoutingTable:
    return RoutingTable({r: v for r, v in table.routes.items() if r in ck.SAGE_HOOK_ROLES}, source=table.source)


def build(out: str | Path, table: RoutingTable, learned_for: RoutingTable, *, objective: TaskObjective,
          checkpoint: str | Path | None = None, min_confidence: float | None = None,
          bandit: dict | None = None, skills: str | Path | None = None, exploration: dict | None = None,
          why: str = "", ledger: str | Path | None = None,
          arms: Mapping[str, Sequence[tuple[str, str | None, float, str | Path | None]]] | None = None) -> Bundle:
    """Write a bundle to ``out`` (atomically: a killed build leaves the old folder or none). ``table``:
    the models.yaml SAGE will run; ``learned_for``: the table SAGE ran when the logs it was learned
    from were written; ``checkpoint``: a SAGE checkpoint folder written for ``table``; ``bandit``: the
    coder's bandit stats (:func:`bandit_state.warm_start`); ``skills``: a skills root (SAGE's three
    folders of ``SKILL.md``); ``exploration``: what the bundle explores and what that costs. The
    checkpoint and skills folders are copied file by file through the guard: a link or a FIFO inside
    either is refused, never followed. ``ledger``: the decision ledger (``<data>/decisions/ledger.json``);
    ``arms``: ``{lever: [(arm name, candidate id or None, probability, part or None)]}`` with a part a
    ``models.yaml`` (coder) or a skills tree (skills), or None for the bundle's own (the arms file's shape,
    ``assign.load_arms``); the ledger and every part are copied through the guard (never a link, never a
    FIFO opened) and checked as :func:`read` checks them, all before the bundle's folder is written. The
    bundle is read back (:func:`read`) before it is returned."""
    plan = None
    if arms:
        try:
            plan = assign.make_plan({lv: [(a[0], a[1], a[2], {}) for a in entries] for lv, entries in arms.items()})
        except (ValidationError, ValueError) as exc:
            raise BundleError(f"the arms: {exc}") from None
        unknown = sorted(set(plan.levers) - set(ARM_PART))
        if unknown:
            raise BundleError(f"the arms: lever(s) {', '.join(unknown)}: a bundle carries arms of "
                              f"{', '.join(ARM_PART)} only")
    parts: dict[str, dict | None] = {name: None for name in PARTS}
    arm_entries: dict[str, list[dict]] = {}
    with artifacts.atomic_dir(out) as tmp:
        table.write(tmp / MODELS_YAML, header="SAGE's models.yaml, written by sage_pipeline (a deployment bundle: "
                    "bundle.json beside this file says what it was learned for and why).")
        parts["models_yaml"] = {"path": MODELS_YAML}
        if checkpoint is not None:
            _copy_tree(ck._folder(checkpoint), tmp / CHECKPOINT_DIR, "the checkpoint folder")
            manifest = ck.read_manifest(tmp / CHECKPOINT_DIR)
            # the roles SAGE asks the checkpoint about must route as the checkpoint's table does; the coder
            # (its bandit) and the memory optimizer never ask it, so a pinned coder keeps the checkpoint valid
            written_for = RoutingTable.from_dict({"routing": manifest["sage_table"]["routing"]},
                                                 source=f"{checkpoint}'s table")
            ck.check_table(_hook_roles(written_for), _hook_roles(table))
            floor = float(manifest["min_confidence"] if min_confidence is None else min_confidence)
            parts["checkpoint"] = {"path": CHECKPOINT_DIR, "min_confidence": floor, "kind": manifest.get("kind"),
                                   "policy_sha256": manifest.get("sha256")}
        if bandit is not None:
            bandit_state.write(tmp / BANDIT_FILE, bandit)
            parts["bandit_state"] = {"path": BANDIT_FILE}
        if skills is not None:
            _copy_tree(skills, tmp / SKILLS_DIR, "the skills root")
            if not any((tmp / SKILLS_DIR).glob("*/*/SKILL.md")) and not any((tmp / SKILLS_DIR).glob("*/SKILL.md")):
                raise BundleError(f"{skills}: no SKILL.md under it; SAGE_SKILLS_ROOT mirrors SAGE's "
                                  "assets/skills/{discipline,workflow,planning}/<skill>/SKILL.md")
            parts["skills"] = {"path": SKILLS_DIR}
        if ledger is not None:
            src = _copy_source(ledger, tmp / LEDGER_FILE, "file", "the ledger")
            _check_ledger(tmp / LEDGER_FILE, src)
            parts["decisions"] = {"path": LEDGER_FILE}
        real = Path(os.path.realpath(tmp))
        for lever, entries in (plan.levers if plan is not None else {}).items():
            arm_entries[lever] = []
            for a, given in zip(entries, arms[lever]):
                entry = {"name": a.name, "candidate": a.candidate, "threshold": a.threshold, "path": None,
                         "sha256": None}
                if given[3] is not None:
                    rel, kind = arm_path(lever, a.name), assign.LEVER_PARTS[lever][0]
                    src = _copy_source(given[3], tmp / rel, kind, f"arm {lever}/{a.name}'s part")
                    files = _part_files(real, rel, kind)
                    entry |= {"path": rel, "sha256": _hash_part(real, rel, files)[0]}
                    _check_arm(lever, a.name, tmp / rel, str(src), [_rel(real / rel, f) for f in files], table,
                               learned_for)
                arm_entries[lever].append(entry)
        for name, p in parts.items():
            if p is not None:
                rel, kind = PARTS[name]
                p["sha256"] = _hash_part(real, rel, _part_files(real, rel, kind))[0]
        for name in _OPTIONAL:
            if parts[name] is None:
                del parts[name]
        shas = {k: None if v is None else v["sha256"] for k, v in parts.items()}
        manifest = {"format": FORMAT, "id": _ident(shas, arm_entries or None),
                    "created": datetime.now(timezone.utc).isoformat(), "parts": parts,
                    "learned_for": ck.table_digest(learned_for), "objective": objective.model_dump(),
                    "exploration": exploration, "why": why}
        if arm_entries:
            manifest["arms"] = arm_entries
        artifacts.write_json(tmp / MANIFEST, manifest)
    return read(out)


# --- reading a bundle ----------------------------------------------------------------------------------


def _short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def _schema_error(path: Path, exc: ValidationError) -> BundleError:
    problems = []
    errors = exc.errors(include_url=False)
    for e in errors[:6]:
        loc = ".".join(str(x) for x in e["loc"]) or "<document>"
        if e["type"] == "missing":
            problems.append(f"field {loc!r} is missing")
        elif e["type"] == "extra_forbidden":
            problems.append(f"field {loc!r} is not a field of a format-{FORMAT} manifest (unknown fields are "
                            "refused, never ignored)")
        else:
            problems.append(f"field {loc!r}: {e['msg']} (got {_short(e.get('input'))})")
    more = f"; and {len(errors) - 6} more" if len(errors) > 6 else ""
    return BundleError(f"{path}: " + "; ".join(problems) + more + f": {REBUILD}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_type(doc: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(doc), "number")


def _read_manifest(folder: Path, real: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        os.lstat(real / MANIFEST)
    except FileNotFoundError:
        raise BundleError(f"{folder} is not a bundle (no {MANIFEST}): build one (make run writes "
                          "datasets/checkpoints/bundle)") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot be read ({exc.strerror}): check the path") from None
    try:
        if os.path.islink(real / MANIFEST):
            raise untrusted.Untrusted(real / MANIFEST, real, "link", "the manifest is never a link")
        data = untrusted.read_bytes(real, MANIFEST, MAX_MANIFEST_BYTES)
    except untrusted.Untrusted as exc:
        raise BundleError(f"{path}: {exc}") from None
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}): {REBUILD}") from None
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}: not JSON ({exc.msg}, line {exc.lineno}): {REBUILD}") from None
    except (ValueError, RecursionError) as exc:  # NaN/Infinity; nesting deeper than the parser goes
        raise BundleError(f"{path}: not JSON ({type(exc).__name__}: {_short(str(exc))}): {REBUILD}") from None
    if not isinstance(doc, dict):
        raise BundleError(f"{path}: the manifest must be a JSON object ({{\"format\": {FORMAT}, \"id\": ...}}), got a "
                          f"JSON {_json_type(doc)}: {REBUILD}")
    if "format" in doc and (type(doc["format"]) is not int or doc["format"] != FORMAT):  # True == 1 in Python
        raise BundleError(f"{path}: field 'format' is {_short(doc['format'])}, this version reads {FORMAT}: build the "
                          "bundle with this version, or deploy it with the version that wrote it")
    try:
        return Manifest.model_validate(doc, strict=True)
    except ValidationError as exc:
        raise _schema_error(path, exc) from None


def read(folder: str | Path) -> Bundle:
    """The bundle at ``folder``, verified whole (see the module doc): the manifest through the guard and
    its schema, every part a regular file or folder with no link, its sha256 and the id recomputed from
    the contents, each part parsed as SAGE will read it. Raises :class:`BundleError` naming the file,
    the field and what to do; writes nothing."""
    folder = Path(folder)
    real = Path(os.path.realpath(folder))
    path = folder / MANIFEST
    m = _read_manifest(folder, real)
    _check_arms(path, m.arms or {})
    sha: dict[str, str | None] = {name: None for name in PARTS}
    files: dict[str, dict[str, str]] = {}
    total = 0
    for name, (rel, kind) in PARTS.items():
        entry = getattr(m.parts, name)
        if entry is None:
            continue
        where = folder / rel
        try:
            got, files[name], n = _hash_part(real, rel, _part_files(real, rel, kind), MAX_BUNDLE_BYTES - total)
        except FileNotFoundError:
            raise BundleError(f"{path}: part {name!r} ({where}) is missing: {REBUILD}") from None
        except untrusted.Untrusted as exc:
            raise BundleError(f"{path}: part {name!r} is refused: {exc}") from None
        total += n
        if got != entry.sha256:
            raise BundleError(f"{path}: part {name!r} ({where}) changed since the bundle was built (sha256 differs): "
                              f"{REBUILD}")
        sha[name] = got
    arm_files: dict[tuple[str, str], list[str]] = {}
    for lever, entries in (m.arms or {}).items():
        for a in entries:
            if a.path is None:
                continue
            where = folder / a.path
            try:
                got, shas, n = _hash_part(real, a.path, _part_files(real, a.path, assign.LEVER_PARTS[lever][0]),
                                          MAX_BUNDLE_BYTES - total)
            except FileNotFoundError:
                raise BundleError(f"{path}: arm 'arms.{lever}.{a.name}' ({where}) is missing: {REBUILD}") from None
            except untrusted.Untrusted as exc:
                raise BundleError(f"{path}: arm 'arms.{lever}.{a.name}' is refused: {exc}") from None
            total += n
            if got != a.sha256:
                raise BundleError(f"{path}: arm 'arms.{lever}.{a.name}' ({where}) changed since the bundle was built "
                                  f"(sha256 differs): {REBUILD}")
            arm_files[(lever, a.name)] = list(shas)
    ident = _ident(sha, None if m.arms is None else
                   {lv: [a.model_dump() for a in entries] for lv, entries in m.arms.items()})
    if m.id != ident:
        raise BundleError(f"{path}: field 'id' is {_short(m.id, 80)}, but the parts' contents give the id {ident}: "
                          f"the id is always recomputed from the parts, never taken as written: {REBUILD}")
    routing_sha = hashlib.sha256(json.dumps(m.learned_for.routing, sort_keys=True).encode()).hexdigest()
    if routing_sha != m.learned_for.routing_sha256:
        raise BundleError(f"{path}: field 'learned_for.routing_sha256' is {m.learned_for.routing_sha256}, but "
                          f"'learned_for.routing' hashes to {routing_sha} (the table was edited): {REBUILD}")
    try:
        RoutingTable.from_dict({"routing": m.learned_for.routing}, source=f"{path} field 'learned_for'")
    except ValueError as exc:
        raise BundleError(f"{path}: field 'learned_for.routing' is not a routing table ({exc}): {REBUILD}") from None
    try:
        table = RoutingTable.load(real / MODELS_YAML)
    except ValueError as exc:
        raise BundleError(f"{path}: part 'models_yaml' is not a table SAGE reads: {exc}: {REBUILD}") from None
    if m.parts.checkpoint is not None:
        _check_checkpoint(path, real, m.parts.checkpoint, files["checkpoint"], table)
    if m.parts.bandit_state is not None:
        try:
            bandit_state.read(real / BANDIT_FILE)
        except ValueError as exc:
            raise BundleError(f"{path}: part 'bandit_state' is not SAGE's bandit state: {exc}") from None
    if m.parts.skills is not None and not any(Path(k).name == "SKILL.md" and len(Path(k).parts) in (2, 3)
                                              for k in files["skills"]):
        raise BundleError(f"{path}: part 'skills' ({folder / SKILLS_DIR}) holds no <discipline>/<skill>/SKILL.md: "
                          f"{REBUILD}")
    if m.parts.decisions is not None:
        try:
            _check_ledger(real / LEDGER_FILE, folder / LEDGER_FILE)
        except BundleError as exc:
            raise BundleError(f"{path}: {exc}: {REBUILD}") from None
    if arm_files:
        learned_for = RoutingTable.from_dict({"routing": m.learned_for.routing}, source=f"{path} field 'learned_for'")
        for (lever, arm), names in arm_files.items():
            rel = arm_path(lever, arm)
            try:
                _check_arm(lever, arm, real / rel, str(path), names, table, learned_for)
            except BundleError as exc:
                raise BundleError(f"{exc}: {REBUILD}") from None
    manifest = m.model_dump(mode="json")
    for name in _OPTIONAL:  # a bundle without them reads as it always did
        if manifest["parts"].get(name) is None:
            manifest["parts"].pop(name, None)
    if manifest.get("arms") is None:
        manifest.pop("arms", None)
    return Bundle(folder, manifest, ident)


def _check_checkpoint(path: Path, real: Path, part: CheckpointPart, shas: dict[str, str], table: RoutingTable) -> None:
    """The checkpoint part is a SAGE router checkpoint whose policy.joblib is the one its manifest.json
    (and the bundle's) names, written for the bundle's table on the roles SAGE asks it about."""
    folder = real / CHECKPOINT_DIR
    for need in (ck.JOBLIB_NAME, ck.MANIFEST_NAME):
        if need not in shas:
            raise BundleError(f"{path}: part 'checkpoint' holds no {need}: not a SAGE router checkpoint: {REBUILD}")
    where = folder / ck.MANIFEST_NAME
    try:
        cm = json.loads(untrusted.read_text(real, where, MAX_MANIFEST_BYTES), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{where}: not a checkpoint manifest ({_short(str(exc), 200)}): {REBUILD}") from None
    if not isinstance(cm, dict) or cm.get("format") != ck.FORMAT:
        raise BundleError(f"{where}: field 'format' is not {ck.FORMAT!r}: not a SAGE router checkpoint: {REBUILD}")
    joblib_sha = shas[ck.JOBLIB_NAME]
    if cm.get("sha256") != joblib_sha:
        raise BundleError(f"{folder / ck.JOBLIB_NAME}: sha256 {joblib_sha} differs from the one {ck.MANIFEST_NAME} "
                          f"names (field 'sha256': {_short(cm.get('sha256'))}): the policy was replaced: {REBUILD}")
    if part.policy_sha256 is not None and part.policy_sha256 != joblib_sha:
        raise BundleError(f"{path}: field 'parts.checkpoint.policy_sha256' is {part.policy_sha256}, the checkpoint's "
                          f"{ck.JOBLIB_NAME} has sha256 {joblib_sha}: {REBUILD}")
    if part.kind is not None and part.kind != cm.get("kind"):
        raise BundleError(f"{path}: field 'parts.checkpoint.kind' is {part.kind!r}, the checkpoint's "
                          f"{ck.MANIFEST_NAME} says {_short(cm.get('kind'))}: {REBUILD}")
    routing = cm.get("sage_table", {}).get("routing") if isinstance(cm.get("sage_table"), dict) else None
    try:
        written_for = RoutingTable.from_dict({"routing": routing}, source=f"{where} field 'sage_table'")
        ck.check_table(_hook_roles(written_for), _hook_roles(table))
    except ValueError as exc:
        raise BundleError(f"{path}: part 'checkpoint' was not written for the bundle's models.yaml: {exc}") from None


def target_table(sage_python: str | None = None, env: dict | None = None) -> RoutingTable:
    """The table the target SAGE runs. With ``sage_python``: asked of SAGE's own code under ``env``
    (``ModelRouter().config``: ``SAGE_MODELS_YAML``, the user's config dir, the packaged file, test
    profiles applied). Without: ``SAGE_MODELS_YAML`` or the user's config dir, as ``config/paths.py``
    resolves them; SAGE's packaged table needs ``sage_python`` to be found."""
    env = dict(os.environ if env is None else env)
    if sage_python:
        code = ("import json\nfrom sage.orchestrator.model_router import ModelRouter\n"
                "from sage.config.paths import resolved_models_yaml_path as p\n"
                "print(json.dumps({'path': str(p()), 'config': ModelRouter().config}))")
        out = subprocess.run([sage_python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BundleError(f"{sage_python} could not read SAGE's table: {out.stderr.strip()[-400:]}")
        got = json.loads(out.stdout.strip().splitlines()[-1])
        return RoutingTable.from_dict(got["config"], source=got["path"])
    override = (env.get("SAGE_MODELS_YAML") or "").strip()
    if override:
        return RoutingTable.load(Path(override).expanduser())
    xdg = (env.get("XDG_CONFIG_HOME") or "").strip()
    user = (Path(xdg) if xdg else Path(env.get("HOME", str(Path.home()))) / ".config") / "sage" / "models.yaml"
    if user.is_file():
        return RoutingTable.load(user)
    raise BundleError("the target SAGE reads its packaged models.yaml (no SAGE_MODELS_YAML, no "
                      f"{user}): give --sage-python (the target SAGE's interpreter) so its table can be read")


# --- the env file: generated shell text, and its one grammar ----------------------------------------------

# one statement of an env file, as env_file_text writes it: a comment, `unset NAME`, `export NAME=VALUE`
# with VALUE as shlex.quote writes it (bare when every character is safe, else single-quoted with each
# ' written '"'"'), or an empty line; each ends at a newline outside the quotes
_STATEMENT = re.compile(r"""
      (?P<comment>\#[^\n]*)
    | unset\ (?P<unset>[A-Z_][A-Z0-9_]*)
    | export\ (?P<name>[A-Z_][A-Z0-9_]*)=(?P<value>[\w@%+=:,./-]+|'[^']*'(?:"'"'[^']*')*)
    | (?P<blank>)
""", re.VERBOSE | re.ASCII)
ENV_GRAMMAR = ("only `# comment`, `unset NAME` and `export NAME=VALUE` lines are read (NAME matching "
               "^[A-Z_][A-Z0-9_]*$, VALUE exactly as shlex.quote writes it), never run")


def env_file_text(env: dict[str, str], bundle_id: str) -> str:
    """The env file of bundle ``bundle_id`` exporting ``env`` (and unsetting the router variables it does
    not set): comments of the project's own words, ``unset NAME``, ``export NAME=<shlex.quote(value)>``."""
    if not _HEX64.fullmatch(bundle_id):
        raise ValueError(f"bundle id {_short(bundle_id)} is not a sha256: ids are recomputed, never taken as text")
    lines = [f"# SAGE's deployment bundle {bundle_id}. Start SAGE with `. <deploy root>/{ENV_FILE}` (a link to",
             f"# {CURRENT}/{ENV_FILE}): every path below is inside this version, which never changes, so one SAGE",
             "# run reads one whole bundle. Generated by sage_pipeline: values quoted with shlex.quote."]
    for k in ROUTER_VARS:
        if k not in env:
            lines.append(f"unset {k}")
    for k, v in env.items():
        if not ENV_NAME.fullmatch(k) or "\0" in v:
            raise ValueError(f"{k!r}={_short(v)}: not an environment variable a shell can export")
        lines.append(f"export {k}={shlex.quote(v)}")
    return "\n".join(lines) + "\n"


def _unquote(token: str) -> str | None:
    """The value shlex.quote wrote as ``token``, or None when ``token`` is not exactly its output."""
    value = token[1:-1].replace("'\"'\"'", "'") if token.startswith("'") else token
    return value if shlex.quote(value) == token else None


def read_env_file(path: str | Path) -> dict[str, str]:
    """The exports of an env file in the grammar :func:`env_file_text` writes (:data:`ENV_GRAMMAR`): a
    deployed ``sage.env`` or a target's env file. The file is read through the guard (its folder is the
    root: a link out of it is refused); any other line is a :class:`BundleError` naming the file and line."""
    path = Path(path)
    try:
        text = untrusted.read_text(path.parent, path.name, MAX_MANIFEST_BYTES)
    except untrusted.Untrusted as exc:
        raise BundleError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}): write it again") from None
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _STATEMENT.match(text, pos)
        end = m.end()
        value = None if m["value"] is None else _unquote(m["value"])
        if (end < len(text) and text[end] != "\n") or (m["value"] is not None and value is None):
            line = text.count("\n", 0, pos) + 1
            bad = text[pos:].split("\n", 1)[0]
            raise BundleError(f"{path}:{line}: {_short(bad, 80)} is not a line of a generated env file: {ENV_GRAMMAR}. "
                              "Write the file again (a deploy writes ROOT/sage.env), quoting each value with "
                              "shlex.quote")
        if m["name"] is not None:
            out[m["name"]] = value
        pos = end + 1
    return out


# --- deploying -----------------------------------------------------------------------------------------


def _switch(link: Path, target: str) -> None:
    """Make ``link`` the symlink ``target`` in one rename (a reader sees the old link or the new one)."""
    tmp = link.parent / f".{link.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    artifacts.fsync_dir(link.parent)


def _whole(version: Path, ident: str) -> bool:
    try:
        return read(version).id == ident
    except BundleError:
        return False


def _write_env(version: Path, text: str) -> None:
    """``version``'s own sage.env, written when it is missing or says another thing (atomically)."""
    with contextlib.suppress(OSError):
        if (version / ENV_FILE).read_text(encoding="utf-8") == text:
            return
    artifacts.write_text(version / ENV_FILE, text)


def _link_env(root: Path) -> None:
    """``root/sage.env`` as the link ``current/sage.env``. A root an older version deployed (a regular
    sage.env) gets the link once, after the version ``current`` names has its own sage.env."""
    want = f"{CURRENT}/{ENV_FILE}"
    env = root / ENV_FILE
    if env.is_symlink() and os.readlink(env) == want:
        return
    if (root / CURRENT).is_symlink():
        cur = root / VERSIONS_DIR / Path(os.readlink(root / CURRENT)).name
        with contextlib.suppress(BundleError):
            old = read(cur)
            _write_env(cur, env_file_text(old.env(cur), old.id))
    _switch(env, want)


def _link_launcher(root: Path) -> None:
    """``root/sage-run`` as the link ``current/sage-run`` (made once), like ``root/sage.env``."""
    link = root / LAUNCHER
    if not (link.is_symlink() and os.readlink(link) == f"{CURRENT}/{LAUNCHER}"):
        _switch(link, f"{CURRENT}/{LAUNCHER}")


def deployed_plans(root: str | Path) -> tuple[dict[str, assign.Plan], list[str]]:
    """Every plan a launcher under ``root`` has drawn from, by id (``versions/*/assignment_plan.json``), and
    the ones that could not be read (named): ``assign.read_records(root/assignments.jsonl, plans)`` joins
    each recorded run to the plan that drew it."""
    return assign.load_plans(Path(root) / VERSIONS_DIR)


def _append_line(path: Path, obj: dict) -> None:
    """One whole JSON line appended to ``path`` (O_APPEND, one write, fsync; the caller holds the lock).
    A line a killed writer left without its newline is closed first, so this one stays whole."""
    data = (json.dumps(obj, allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:  # one write; a short one (a full disk) goes on with the rest of the same line
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _bandit_dest(ws: str | Path) -> Path:
    """Where the bandit state goes in workspace ``ws``; refused when the workspace's ``memory/rl`` (or a
    folder on the way) is a link out of it (a workspace is written by an LLM)."""
    dest = Path(ws).joinpath(*bandit_state.STATE_PATH)
    for p in (dest.parent, *dest.parent.parents):
        if p == Path(ws) or p in Path(ws).parents:
            break
        if os.path.lexists(p):
            untrusted.resolve_inside(ws, p)
    return dest


def _check_target(b: Bundle, table: RoutingTable, target: RoutingTable) -> None:
    problems = ck.table_differences(b.learned_for, target)
    if problems and ck.table_differences(table, target):
        raise BundleRefused(b.id[:12], str(target.source), problems)


def deploy(bundle: str | Path | Bundle, root: str | Path, *, target: RoutingTable,
           workspaces: tuple[str | Path, ...] = (), data_dir: str | Path | None = None,
           deployed_from: datetime | None = None, sage: str = "sage") -> dict:
    """Deploy ``bundle`` under ``root`` for a SAGE running ``target`` (see the module doc). The bundle
    is read from its folder and verified whole (a :class:`Bundle` given is read again), and the target and
    the workspaces checked, before anything is written. With arms, the version's launcher runs ``sage``
    (an executable on PATH when the run starts, or a path). Returns the deployment's record line (with a
    launcher: ``launcher``, ``plan``, ``assignments``)."""
    b = read(bundle.folder if isinstance(bundle, Bundle) else bundle)
    root = Path(os.path.abspath(root))
    _check_target(b, b.table, target)
    try:
        dests = [(ws, _bandit_dest(ws)) for ws in workspaces] if b.part("bandit_state") is not None else []
    except untrusted.Untrusted as exc:
        raise BundleError(f"workspace refused: {exc}") from None
    version = root / VERSIONS_DIR / b.id
    env = b.env(version)
    text = env_file_text(env, b.id)
    plan = b.plan(version)
    unset = [k for k in ROUTER_VARS if k not in env]
    if "\0" in sage or not sage:
        raise BundleError(f"the sage executable {_short(sage)}: give a name on PATH or a path")
    with artifacts.exclusive(root, LOCK_NAME):
        now = deployed_from or datetime.now(timezone.utc)
        if _whole(version, b.id):
            _write_env(version, text)
        else:
            with artifacts.atomic_dir(version) as tmp:
                real = Path(os.path.realpath(b.folder))
                for name, (rel, kind) in PARTS.items():
                    if b.part(name) is not None:
                        _copy_files(real, rel, _part_files(real, rel, kind), tmp / rel)
                for lever, entries in b.arms.items():
                    for a in entries:
                        if a["path"] is not None:
                            kind = assign.LEVER_PARTS[lever][0]
                            _copy_files(real, a["path"], _part_files(real, a["path"], kind), tmp / a["path"])
                artifacts.write_json(tmp / MANIFEST, b.manifest)
                try:
                    got = read(tmp).id
                except BundleError as exc:
                    got = f"none: {exc}"
                if got != b.id:
                    raise BundleError(f"{b.folder}: its parts changed while they were copied (read as {b.id}, the "
                                      f"copy's id {got}): nothing was switched; deploy it again")
                artifacts.write_text(tmp / ENV_FILE, text)
        # again on the copy, whose every byte was checked: the bundle's folder may have changed since
        _check_target(b, RoutingTable.load(version / MODELS_YAML), target)
        _link_env(root)
        launched = None
        if plan is not None or (root / LAUNCHER).is_symlink():  # a root that had a launcher keeps one
            launched = plan or assign.Plan(levers={}, note=f"bundle {b.id}: no arms, nothing drawn")
            assign.write_launcher(version, launched, sage, records_dir=root, base_env=env, unset=unset)
            _link_launcher(root)
        _switch(root / CURRENT, f"{VERSIONS_DIR}/{b.id}")
        installed = []
        for ws, dest in dests:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _bandit_dest(ws)  # again, now that its folders exist
            artifacts.write_bytes(dest, (version / BANDIT_FILE).read_bytes())
            installed.append(str(dest))
        dep = None
        if data_dir is not None:
            cp = b.manifest["parts"].get("checkpoint")
            dep = explore.record_deployment(data_dir, None if cp is None else version / CHECKPOINT_DIR, now,
                                            None if cp is None else cp["min_confidence"])
        line = {"bundle": b.id, "deployed_from": now.isoformat(), "version": str(version), "env": env,
                "bandit_state_written_to": installed, "routing_record": None if dep is None else dep.to_dict(),
                "learned_for": b.manifest["learned_for"]["routing_sha256"]}
        if launched is not None:
            line |= {"launcher": str(root / LAUNCHER), "plan": launched.id, "assignments": str(root / ASSIGNMENTS),
                     "arms": {lv: [{"arm": a.name, "candidate": a.candidate, "threshold": a.threshold}
                                   for a in arms] for lv, arms in launched.levers.items()}}
        _append_line(root / RECORD, line)
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sage_pipeline.sage.bundle",
                                 description="SAGE's deployment bundle: models.yaml, router checkpoint, coder "
                                             "bandit state and skills root, switched as one.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("deploy", help="deploy BUNDLE under ROOT (then start SAGE with `. ROOT/sage.env`, or with "
                       "`ROOT/sage-run \"<prompt>\"` when the bundle has arms)")
    d.add_argument("bundle", help="the bundle folder (make run writes datasets/checkpoints/bundle)")
    d.add_argument("root", help="where deployed versions, sage.env and the record live")
    d.add_argument("--sage-python", default=os.environ.get("SAGE_PYTHON"),
                   help="the target SAGE's interpreter: its own code reads the table it runs (default: SAGE_PYTHON)")
    d.add_argument("--target-env", default=None, help="an env file the target SAGE runs with, in the grammar "
                   "sage.env is written in (default: ROOT/sage.env when it exists, else this process's environment)")
    d.add_argument("--workspace", action="append", default=[], help="a SAGE workspace to write the bandit state into")
    d.add_argument("--data-dir", default=os.environ.get("SAGE_DATA_DIR"),
                   help="the pipeline's artifact root, to record the checkpoint for the routing dataset")
    d.add_argument("--sage", default="sage", help="the sage executable a bundle's launcher (ROOT/sage-run) runs: "
                   "a name found on PATH when each run starts, or a path (default: sage)")
    s = sub.add_parser("show", help="print a bundle's manifest")
    s.add_argument("bundle")
    args = ap.parse_args(argv)
    try:
        if args.command == "show":
            print(json.dumps(read(args.bundle).manifest, indent=2))
            return 0
        env = dict(os.environ)
        env_file = Path(args.target_env) if args.target_env else Path(args.root) / ENV_FILE
        if env_file.is_file():
            env.update(read_env_file(env_file))
        target = target_table(args.sage_python, env)
        line = deploy(args.bundle, args.root, target=target, workspaces=tuple(args.workspace),
                      data_dir=args.data_dir, sage=args.sage)
    except (BundleError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"deployed bundle {line['bundle'][:12]} under {shlex.quote(args.root)}; start SAGE with: "
          f". {shlex.quote(str(Path(args.root) / ENV_FILE))}")
    for k, v in line["env"].items():
        print(f"export {k}={shlex.quote(v)}")
    if "launcher" in line:
        arms = "; ".join(f"{lv}: " + ", ".join(f"{a['arm']} {a['threshold'] / assign.SCALE:.4g}" for a in arms)
                         for lv, arms in line["arms"].items()) or "no arms: nothing is drawn"
        print(f"wrote the launcher {shlex.quote(line['launcher'])} (plan {line['plan']}; {arms}). Start SAGE "
              f"through it: {shlex.quote(line['launcher'])} \"<prompt>\" instead of sage run \"<prompt>\": it sets the "
              f"whole environment above, draws each run's arms and records the draw in "
              f"{shlex.quote(line['assignments'])} (SAGE_TRACE_ID is the draw id)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
