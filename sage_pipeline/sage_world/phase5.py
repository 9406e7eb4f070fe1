"""SAGE's own Phase-5 offline RL tools (``sage rl export``, ``train-bc``, ``train-cql``, ``eval-offline``)
run on the loop's journals in SAGE's virtualenv, and their claim beside the model world's exact truth.

What each tool does, read in SAGE's source (``src/sage/cli/main.py`` dispatches to ``src/sage/rl/``):

* ``export --log-dir D --output F`` (``export_dataset.export_logs_to_jsonl``): every ``D/*.log`` (one
  folder, not recursive), each line a JSON event (``session_id`` or, without one, the file's stem).
  One row per ``TRAJECTORY_STEP`` of a router role (planner ... memory_optimizer) with a ``task_id`` and a
  non-empty ``action.model_chosen``: ``action_fallback = model_chosen == the role's fallback`` in the
  models.yaml SAGE resolves (``SAGE_MODELS_YAML``), ``reward = composite_reward(step reward,
  verification_passed, terminal, failed_reason)`` where the last two come from the *task_id's* last
  step over every file. Writes ``F`` and ``F.meta.json`` (``row_count``) and prints the meta.
* ``train-bc --data F --out P`` (``train_bc.train_bc_joblib``): per role with 4 rows or more a
  scikit-learn ``LogisticRegression`` of ``action_fallback`` on ``[task_complexity_score,
  primary_failure_count]``; joblib ``{"kind": "bc_sklearn_logistic", "feature_keys", "models": {role:
  clf}, "metrics", "schema_version"}``. A role whose rows carry one label only makes scikit-learn raise:
  the tool exits non-zero and writes nothing.
* ``train-cql --data F --out P`` (``train_cql.train_cql_stub``): per role with 50 rows or more and 25 of
  each action, one ``Ridge`` of the reward per action; joblib ``{"kind": "cql_ridge", "models": {role:
  {"q_models": {0: ridge, 1: ridge}, "counts": {0: n0, 1: n1}}}, "pessimism_lambda", ...}``. Fewer rows:
  no role, an empty ``models``.
* ``eval-offline --data F --checkpoint P --out J --min-confidence f`` (``eval_offline``): loads ``P`` as
  SAGE's router does (``policy.load_routing_policy``: ``cql_ridge`` through its adapter, P(fallback) =
  logistic of the pessimistic Q margin); writes ``J`` = ``{rows, static_mean_reward, policy_mean_reward,
  delta, data_path, checkpoint, min_confidence}``. The CLI calls it "compare checkpoint vs dataset
  baseline": ``delta`` is SAGE's headline, the checkpoint's improvement over the data.

What SAGE's number is (:func:`sage_offline_eval` computes it again from the same rows, and the contract
test finds SAGE's own figure): ``static_mean_reward`` is the mean exported reward of every row;
``policy_mean_reward`` the mean over the rows whose logged ``action_fallback`` equals the checkpoint's
choice, among those whose confidence is at least ``--min-confidence`` (a choice below
``SAGE_RL_MIN_CONFIDENCE`` counts as "primary", not as SAGE's YAML; no agreeing row gives 0.0). That is
E[reward | logged action = the checkpoint's] over the logging distribution, rows the checkpoint disagrees
with dropped rather than reweighted: the value of serving the checkpoint only when the logged actions
were drawn independently of the outcome given the state, every action possible, and the checkpoint's
choices do not change which rows exist. In SAGE's ``sage run`` journals none holds, and SAGE's code makes
the number about something else (read in ``orchestrator/workflow.py`` and ``rl/export_dataset.py``):

1. the label is the coder's model: the reviewer's and debugger's steps carry ``model_chosen =
   task.model_used`` (what SAGE's UCB bandit gave the coder), so ``action_fallback`` says "the coder ran
   the role's fallback model", never how the reviewer or debugger was routed;
2. the reward of every row shares one shift: ``verification_passed`` and ``failed_reason`` are the last
   ones seen for the task_id over all journals, and every ``sage run`` plan names its task ``task_001``;
3. a debugger row's ``primary_failure_count`` is the count before the call (``task.retry_count``), one
   below the count SAGE's router is given for that call (``next_retry``).

So SAGE's claim is per exported row, in its export's reward, conditional on agreement; the world cannot
value that quantity for a policy (the shift depends on which run happened to be last). :func:`judge`
sets beside it what the claim is about, exactly on the day's runs: the value of SAGE serving the
checkpoint at the same floor, per task, in reward_v1 return (the routing dataset's join of the same
composite reward) and under the task objective, against the policy that logged the data and SAGE's
shipped YAML; the claim's direction ("the checkpoint beats the data") against the sign of the true
difference. Only the direction and the order of checkpoints can be compared; the magnitudes are in
different units.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.sage import checkpoint as sage_router
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sage_world import truth as T
from sage_pipeline.sage_world.world import ModelWorld

log = logging.getLogger(__name__)

LOGS_DIR, DATASET_NAME, RESULT_NAME, JUDGED_NAME = "logs", "routing_v1.jsonl", "phase5.json", "phase5_judged.json"
TRAINERS = {"bc": "train-bc", "cql": "train-cql"}  # checkpoint folder -> SAGE's tool
CLAIM_FIELDS = ("rows", "static_mean_reward", "policy_mean_reward", "delta")  # eval-offline's numbers


class Phase5Config(BaseModel):
    """How SAGE's Phase-5 tools are run (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_confidence: float = Field(sage_router.SAGE_DEFAULT_MIN_CONFIDENCE, ge=0.0, le=1.0,
                                  description="the floor eval-offline judges each checkpoint at "
                                              "(--min-confidence and SAGE_RL_MIN_CONFIDENCE), the one SAGE would "
                                              "serve it at")
    tool_timeout_s: float = Field(600.0, gt=0, description="a tool still running after this is killed (with its "
                                  "process group) and recorded as failed")
    stderr_tail_chars: int = Field(2000, ge=100, description="how much of a failed tool's stderr is kept")


# ------------------------------------------------------------------ the journals, in one folder
def merge_journals(log_dirs: Sequence[str | os.PathLike[str]], dest: str | os.PathLike[str]) -> dict:
    """SAGE's exporter reads one folder's ``*.log``: every ``*.log`` of ``log_dirs`` goes into ``dest``
    under SAGE's own file name. Files of one name from several folders (each workspace writes
    ``<date>.log``) are concatenated in the order of ``log_dirs``, a newline put between two when the
    first lacks one, so each line reads as it did alone (session ids are on the lines; a line without one
    keeps its file's stem). Returns the files written, their sources and the folders that are missing."""
    dest = Path(dest)
    missing = [str(d) for d in log_dirs if not Path(d).is_dir()]
    by_name: dict[str, list[Path]] = {}
    for d in log_dirs:
        if Path(d).is_dir():
            for f in sorted(Path(d).glob("*.log")):
                by_name.setdefault(f.name, []).append(f)
    dest.mkdir(parents=True, exist_ok=True)
    for name, sources in sorted(by_name.items()):
        parts = []
        for src in sources:
            data = src.read_bytes()
            parts.append(data if not data or data.endswith(b"\n") else data + b"\n")
        artifacts.write_bytes(dest / name, b"".join(parts))
    return {"log_dir": str(dest), "files": len(by_name), "sources": sum(len(s) for s in by_name.values()),
            "joined": {n: [str(s) for s in src] for n, src in sorted(by_name.items()) if len(src) > 1},
            "missing_log_dirs": missing}


# ------------------------------------------------------------------ running SAGE's tools
def tool_env(work_dir: Path, sage_python: Path, min_confidence: float, models_yaml: Path | None) -> dict[str, str]:
    """The tools' environment, built from scratch as the harness's (``harness.sage_env``): nothing of the
    project's (no PYTHONPATH, no virtualenv), ``HOME`` inside ``work_dir`` (so no user's
    ``~/.config/sage/models.yaml``), SAGE's python first on ``PATH``, the floor eval-offline's loader
    reads, and the models.yaml SAGE ran (``SAGE_MODELS_YAML``; None: SAGE's bundled one)."""
    bindir, home = work_dir / "bin", work_dir / "home"
    bindir.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    py = bindir / "python"
    if not py.exists():
        py.symlink_to(sage_python)
    env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "SAGE_RL_POLICY": "0", "SAGE_RL_MIN_CONFIDENCE": repr(float(min_confidence))}
    if models_yaml is not None:
        env["SAGE_MODELS_YAML"] = str(Path(models_yaml).resolve())
    return env


def _tail(text: str, n: int) -> str:
    text = (text or "").strip()
    return text[-n:]


def _run_tool(name: str, cli: Path, args: list[str], cwd: Path, env: dict[str, str], cfg: Phase5Config,
              progress: Callable[[str], None]) -> dict:
    """One ``sage rl <args>`` in ``cwd``; its record: argv, return code, seconds, status and cause, stdout's
    JSON (SAGE's tools print one), stderr's tail on failure."""
    argv = [str(cli), "rl", *args]
    rec: dict[str, Any] = {"tool": name, "argv": argv, "returncode": None, "seconds": 0.0, "status": "failed",
                           "cause": None, "stderr_tail": None}
    progress(f"phase5: sage rl {' '.join(args[:1])} ...")
    t0 = time.perf_counter()
    try:  # its own process group: a tool past its limit is killed with whatever it started
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as exc:
        rec.update(cause=f"could not start {cli}: {exc}: install SAGE with scripts/sage_venv.sh and pass its python")
        return rec
    try:
        stdout, stderr = proc.communicate(timeout=cfg.tool_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        rec.update(seconds=round(time.perf_counter() - t0, 3), stderr_tail=_tail(stderr, cfg.stderr_tail_chars),
                   cause=f"killed after the {cfg.tool_timeout_s:g} s limit (Phase5Config.tool_timeout_s)")
        progress(f"phase5: {name} {rec['cause']}")
        return rec
    rec.update(returncode=proc.returncode, seconds=round(time.perf_counter() - t0, 3))
    try:
        rec["stdout_json"] = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        rec["stdout_json"] = None
    if proc.returncode != 0:
        last = [ln for ln in (stderr or stdout or "").strip().splitlines() if ln.strip()]
        rec.update(stderr_tail=_tail(stderr, cfg.stderr_tail_chars),
                   cause=f"exit {proc.returncode}: {last[-1].strip()[:300] if last else 'no output'}")
    else:
        rec.update(status="ok")
    why = f" ({rec['cause']})" if rec["cause"] else ""
    progress(f"phase5: {name} {rec['status']} in {rec['seconds']:.1f} s{why}")
    return rec


def _skipped(name: str, cause: str) -> dict:
    return {"tool": name, "argv": None, "returncode": None, "seconds": 0.0, "status": "skipped", "cause": cause,
            "stderr_tail": None}


def _read_json(path: Path):
    """A JSON file SAGE wrote beside its output (meta, report), or None when it is missing or unreadable: it
    is recorded, not needed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for ln in fh if ln.strip())


def run_tools(sage_python: str | os.PathLike[str], log_dirs: Sequence[str | os.PathLike[str]],
              work_dir: str | os.PathLike[str], min_confidence: float | None = None,
              models_yaml: str | os.PathLike[str] | None = None, config: Phase5Config | None = None,
              progress: Callable[[str], None] = log.info) -> dict:
    """Run SAGE's Phase-5 tools on the journals of ``log_dirs`` (SAGE's ``memory/sessions`` folders) in
    ``work_dir`` (a fresh folder: a stale checkpoint must never stand for tonight's), each as a subprocess
    of SAGE's virtualenv (the ``sage`` script beside ``sage_python``) with :func:`tool_env`: the journals
    merged into ``work_dir/logs`` (:func:`merge_journals`), ``export`` to ``work_dir/routing_v1.jsonl``,
    ``train-bc`` and ``train-cql`` to ``work_dir/{bc,cql}/policy.joblib``, ``eval-offline`` of each at
    ``min_confidence`` (default the config's) to ``work_dir/{bc,cql}/offline_eval.json``.

    A tool that fails is recorded (return code, cause, stderr's tail) and the others go on; a tool whose
    input is missing is recorded as skipped with the reason. Returns (and writes to
    ``work_dir/phase5.json``) the rows exported, each tool's record and seconds, each checkpoint's path and
    sha256, and each eval-offline JSON verbatim with its claim (:data:`CLAIM_FIELDS`)."""
    cfg = config or Phase5Config()
    floor = cfg.min_confidence if min_confidence is None else float(min_confidence)
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"min_confidence must lie in [0, 1] (SAGE_RL_MIN_CONFIDENCE), got {floor}")
    work = Path(work_dir).resolve()
    if work.exists() and any(work.iterdir()):
        raise FileExistsError(f"{work} is not empty: SAGE's tools write their checkpoints there and a stale one "
                              "would stand for tonight's; pick a new folder (one per night)")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    py = Path(os.path.abspath(sage_python))  # not resolved: a virtualenv's python is a link out of it
    cli = py.parent / "sage"
    yaml_path = Path(models_yaml) if models_yaml is not None else None
    journals = merge_journals(log_dirs, work / LOGS_DIR)
    result: dict[str, Any] = {"work_dir": str(work), "sage_cli": str(cli), "min_confidence": floor,
                              "models_yaml": str(yaml_path) if yaml_path else None, "journals": journals,
                              "export": None, "train": {}, "eval": {}}
    env = tool_env(work, py, floor, yaml_path)
    data = work / DATASET_NAME

    if journals["files"] == 0:
        missing = journals["missing_log_dirs"]
        result["export"] = _skipped("export", (f"log dir(s) {missing} do not exist" if missing else
                                               f"no *.log file in {[str(d) for d in log_dirs]}")
                                    + ": nothing for SAGE's exporter to read; point run_tools at SAGE's "
                                      "memory/sessions folders")
    else:
        rec = _run_tool("export", cli, ["export", "--log-dir", str(work / LOGS_DIR), "--output", str(data)],
                        work, env, cfg, progress)
        if rec["status"] == "ok" and not data.is_file():
            rec.update(status="failed", cause=f"exit 0 but {data} was not written")
        if rec["status"] == "ok":
            meta_path = data.with_suffix(data.suffix + ".meta.json")
            meta = _read_json(meta_path) or rec.get("stdout_json")
            rec.update(rows=_count_lines(data), meta=meta, dataset=str(data),
                       dataset_sha256=artifacts.file_sha256(data))
            if journals["missing_log_dirs"]:
                rec["cause"] = f"log dir(s) {journals['missing_log_dirs']} do not exist: exported the others"
        result["export"] = rec
    exported = result["export"]["status"] == "ok"
    result["rows_exported"] = result["export"].get("rows")

    for kind, tool in TRAINERS.items():
        out = work / kind / sage_router.JOBLIB_NAME
        if not exported:
            result["train"][kind] = _skipped(tool, f"export {result['export']['status']}: no dataset")
            continue
        (work / kind).mkdir(exist_ok=True)
        rec = _run_tool(tool, cli, [tool, "--data", str(data), "--out", str(out)], work, env, cfg, progress)
        if rec["status"] == "ok" and not out.is_file():
            rec.update(status="failed", cause=f"exit 0 but {out} was not written")
        if rec["status"] == "ok":
            rec.update(checkpoint=str(out), sha256=artifacts.file_sha256(out),
                       report=_read_json(out.with_suffix(out.suffix + ".report.json")))
        result["train"][kind] = rec

    for kind, tool in TRAINERS.items():
        train = result["train"][kind]
        if train["status"] != "ok":
            result["eval"][kind] = _skipped("eval-offline", f"{tool} {train['status']}: no checkpoint")
            continue
        out = work / kind / "offline_eval.json"
        rec = _run_tool("eval-offline", cli, ["eval-offline", "--data", str(data), "--checkpoint", train["checkpoint"],
                                              "--out", str(out), "--min-confidence", repr(floor)],
                        work, env, cfg, progress)
        if rec["status"] == "ok":
            try:
                verbatim = json.loads(out.read_text(encoding="utf-8"))
                claim = {k: verbatim[k] for k in CLAIM_FIELDS}
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
                rec.update(status="failed", cause=f"exit 0 but {out} is not eval-offline's JSON with {CLAIM_FIELDS}: "
                                                  f"{type(exc).__name__}: {exc}")
            else:
                rec.update(output=str(out), json=verbatim, claim=claim)
        result["eval"][kind] = rec

    named = [("export", result["export"]), *((TRAINERS[k], t) for k, t in result["train"].items()),
             *((f"eval-offline {k}", t) for k, t in result["eval"].items())]
    result["ok"] = all(t["status"] == "ok" for _, t in named)
    result["failed"] = {n: t["cause"] for n, t in named if t["status"] != "ok"}
    result["seconds"] = round(time.perf_counter() - t0, 3)
    artifacts.write_json(work / RESULT_NAME, result)
    progress(f"phase5: {result['rows_exported']} rows exported; "
             + ("every tool ran" if result["ok"] else f"not ok: {result['failed']}") + f" ({result['seconds']:.1f} s)")
    return result


# ------------------------------------------------------------------ SAGE's checkpoints as the truth reads them
@dataclass(frozen=True)
class CqlRidgeRole:
    """One role of SAGE's ``cql_ridge`` checkpoint as a classifier SAGE's rule can read: ``predict_proba``
    is SAGE's ``_CQLAdapter.predict_proba_fallback`` (``rl/policy.py``): Q0 and Q1 from the two ridges,
    each less ``pessimism_lambda / sqrt(max(count, 1))``, P(fallback) = logistic(Q1c - Q0c)."""

    q0: Any
    q1: Any
    count0: float
    count1: float
    pessimism_lambda: float

    @property
    def classes_(self) -> np.ndarray:
        return np.array([0, 1])

    def predict_proba(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        v0 = np.asarray(self.q0.predict(x), dtype=np.float64) - self.pessimism_lambda / max(self.count0, 1.0) ** 0.5
        v1 = np.asarray(self.q1.predict(x), dtype=np.float64) - self.pessimism_lambda / max(self.count1, 1.0) ** 0.5
        with np.errstate(over="ignore"):  # SAGE: math.exp overflows -> p 0 (margin < 0); numpy: exp -> inf, p 0
            p = 1.0 / (1.0 + np.exp(-(v1 - v0)))
        return np.column_stack([1.0 - p, p])


def cql_models(payload: dict) -> dict[str, CqlRidgeRole]:
    """The roles SAGE's adapter acts on (a dict with both Q models); any other role is (p 0, confidence 0)
    in SAGE, which is a role without a classifier here."""
    lamb = float(payload.get("pessimism_lambda", 0.15))
    out = {}
    for role, m in (payload.get("models") or {}).items():
        if not isinstance(m, dict):
            continue
        qm, counts = m.get("q_models") or {}, m.get("counts") or {}
        if qm.get(0) is None or qm.get(1) is None:
            continue
        out[role] = CqlRidgeRole(qm[0], qm[1], float(counts.get(0, 0) or 0), float(counts.get(1, 0) or 0), lamb)
    return out


def load_trained(table: RoutingTable, path: str | os.PathLike[str], min_confidence: float,
                 name: str | None = None) -> tuple[T.SagePolicy | None, dict]:
    """The policy SAGE's router serves with ``SAGE_RL_CHECKPOINT=path`` at ``min_confidence``, and how it was
    read: ``truth.SagePolicy.load`` is tried first and probed on every role it holds (``truth_load``); a
    ``cql_ridge`` checkpoint (Q models, not classifiers: SagePolicy.load reads it but cannot evaluate it)
    goes through :class:`CqlRidgeRole`, as SAGE's loader dispatches on ``kind``. None when SAGE's own loader
    would return None (its router then keeps its YAML), with the cause."""
    import joblib

    path = Path(path)
    info: dict[str, Any] = {"path": str(path)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            payload = joblib.load(path)
        except Exception as exc:  # noqa: BLE001 - SAGE's loader catches everything too and returns None
            info["cause"] = (f"joblib cannot load {path}: {type(exc).__name__}: {exc}; SAGE's load_routing_policy "
                             "returns None for it and its router keeps its YAML")
            return None, info
    info["load_warnings"] = sorted({str(w.message)[:200] for w in caught})
    if not isinstance(payload, dict) or "models" not in payload:
        info["cause"] = f"{path} holds no dict with 'models': SAGE's loader returns None and its router keeps its YAML"
        return None, info
    info.update(kind=payload.get("kind"), roles=sorted(map(str, payload["models"])))
    try:
        pol = T.SagePolicy.load(table, path, min_confidence, name=name)
        for role in pol.models:
            if role in table.routes:
                pol.p_fallback(role, 0.5, 1)
        info["truth_load"] = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - recorded: whether the project's loader reads SAGE's own file
        pol = None
        info["truth_load"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if payload.get("kind") == "cql_ridge":
        pol = T.SagePolicy(table, dict(cql_models(payload)), float(min_confidence), name or str(path))
        info["read_as"] = "cql_ridge through SAGE's _CQLAdapter rule (phase5.CqlRidgeRole)"
    elif pol is None:
        info["cause"] = f"truth.SagePolicy.load cannot evaluate {path}: {info['truth_load']['error']}"
    else:
        info["read_as"] = "truth.SagePolicy.load"
    return pol, info


def _role_p_conf(clf, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SAGE's RoutingPolicy.predict_proba_fallback over rows: P(class 1) and min(1, |p - 0.5| * 2); no
    classifier: (0, 0)."""
    if clf is None:
        return np.zeros(len(x)), np.zeros(len(x))
    proba = np.asarray(clf.predict_proba(x), dtype=np.float64)
    col = list(getattr(clf, "classes_", [0, 1]))
    p = proba[:, col.index(1)] if 1 in col else proba[:, -1]
    return p, np.minimum(1.0, np.abs(p - 0.5) * 2.0)


def read_export(path: str | os.PathLike[str]) -> list[dict]:
    """The export's rows as SAGE's ``load_routing_jsonl`` reads them (blank and undecodable lines skipped)."""
    out = []
    for ln in Path(path).read_text(encoding="utf-8", errors="ignore").splitlines():
        if ln.strip():
            try:
                out.append(json.loads(ln))
            except json.JSONDecodeError:
                continue
    return out


def sage_offline_eval(rows: list[dict], models: dict, min_confidence: float) -> dict:
    """SAGE's ``eval_offline.offline_eval`` on ``rows`` with the classifiers ``models`` at ``min_confidence``
    (both SAGE_RL_MIN_CONFIDENCE and --min-confidence, as :func:`run_tools` runs it), vectorised, with the
    count SAGE does not print: ``rows_counted``, the rows its policy mean is over."""
    if not rows:
        return {"rows": 0, "rows_counted": 0, "static_mean_reward": 0.0, "policy_mean_reward": 0.0, "delta": 0.0}
    role = np.array([str(r.get("agent_role") or "") for r in rows])
    x = np.array([[float(r.get("task_complexity_score", 0.0) or 0.0),
                   float(int(r.get("primary_failure_count", 0) or 0))] for r in rows], dtype=np.float64)
    rew = np.array([float(r.get("reward", 0.0) or 0.0) for r in rows])
    act = np.array([int(r.get("action_fallback", 0) or 0) for r in rows])
    p, conf = np.zeros(len(rows)), np.zeros(len(rows))
    for name in np.unique(role):
        sel = role == name
        p[sel], conf[sel] = _role_p_conf(models.get(str(name)), x[sel])
    counted = conf >= min_confidence  # below the floor SAGE's should_use_fallback says "primary", then it is skipped
    target = (p >= 0.5).astype(np.int64)
    match = counted & (target == act)
    static = float(rew.mean())
    policy = float(rew[match].mean()) if match.any() else 0.0
    return {"rows": len(rows), "rows_counted": int(match.sum()), "rows_confident": int(counted.sum()),
            "static_mean_reward": static, "policy_mean_reward": policy, "delta": policy - static}


# ------------------------------------------------------------------ the claim beside the truth
def _value(v: T.RunValue, objective: TaskObjective) -> dict:
    return {"return": v.ret, "p_verified": v.p_verified, "objective": v.objective(objective),
            "gpu_seconds": v.gpu_seconds, "usd": v.usd, "calls": v.calls, "debug_calls": v.debug_calls}


def _sign(x: float | None) -> int | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return 0 if abs(x) <= 1e-12 else (1 if x > 0 else -1)


def judge(world: ModelWorld, table: RoutingTable, runs: list[dict], tools_result: dict, objective: TaskObjective,
          project_estimate: float | dict | None = None, behaviour: T.SagePolicy | None = None) -> dict:
    """SAGE's claim for each checkpoint its tools trained, beside the exact truth on ``runs`` (the day's:
    ``{"task_id", "coder_model", "complexity", "tests_at_start"}``; runs without a coder model or a
    complexity cannot be valued and are counted): see the module's doc for what SAGE's number is.

    Per checkpoint: ``claim`` (eval-offline's numbers), ``claim_reproduced`` (:func:`sage_offline_eval` on
    the same rows: how many rows SAGE's policy mean is over), ``truth`` (SAGE serving the checkpoint at the
    run's floor, :func:`load_trained`: reward_v1 return per task, verified chance, the objective, costs),
    ``true_delta`` (against ``behaviour``, the policy that logged the data, default SAGE's YAML over
    ``table``; and against the YAML), ``direction`` (does the sign of SAGE's delta match the true return
    difference's). Beside them: SAGE's shipped YAML's exact value on the same runs and the project's own
    estimate (``project_estimate``, verbatim) when given."""
    floor = float(tools_result.get("min_confidence", sage_router.SAGE_DEFAULT_MIN_CONFIDENCE))
    valued = [r for r in runs if r.get("coder_model") and r.get("complexity") is not None]
    yaml = T.SagePolicy(table, name="SAGE's YAML")
    base = behaviour or yaml
    out: dict[str, Any] = {"runs": len(valued), "runs_not_valued": len(runs) - len(valued),
                           "objective": objective.describe(), "min_confidence": floor,
                           "rows_exported": tools_result.get("rows_exported"), "project": project_estimate,
                           "checkpoints": {},
                           "semantics": "SAGE's claim: mean exported reward per row over the rows whose logged "
                                        "action_fallback (the coder's model) the checkpoint agrees with, minus the "
                                        "mean over all rows. Truth: SAGE serving the checkpoint, per task, exact on "
                                        "the same runs. Compare directions, not magnitudes (phase5 module doc)."}
    if not valued:
        out["why"] = "no run with a coder model and a complexity: the world cannot value any policy"
        return out
    v_yaml, v_base = T.policy_value(world, valued, yaml), T.policy_value(world, valued, base)
    out["yaml"] = _value(v_yaml, objective)
    out["baseline"] = {"name": base.name, **_value(v_base, objective)}
    export = tools_result.get("export") or {}
    rows = read_export(export["dataset"]) if export.get("status") == "ok" else None
    for kind in TRAINERS:
        train = (tools_result.get("train") or {}).get(kind) or {}
        ev = (tools_result.get("eval") or {}).get(kind) or {}
        entry: dict[str, Any] = {"trained": train.get("status") == "ok", "claim": ev.get("claim"),
                                 "eval_status": ev.get("status"), "eval_cause": ev.get("cause")}
        if train.get("status") != "ok":
            entry["cause"] = f"{TRAINERS[kind]} gave no checkpoint: {train.get('cause')}"
            out["checkpoints"][kind] = entry
            continue
        pol, info = load_trained(table, train["checkpoint"], floor, name=f"SAGE {TRAINERS[kind]}")
        entry.update(checkpoint=train["checkpoint"], sha256=train.get("sha256"), load=info)
        if pol is None:  # SAGE's router cannot load it either: it keeps its YAML
            pol = yaml
            entry["served_as"] = "SAGE's YAML (its loader returns None)"
        if rows is not None and pol is not yaml:
            rep = sage_offline_eval(rows, pol.models or {}, floor)
            claim = entry["claim"]
            rep["matches_sage"] = (None if claim is None else bool(
                rep["rows"] == claim["rows"]
                and all(math.isclose(rep[k], float(claim[k]), rel_tol=1e-9, abs_tol=1e-9)
                        for k in ("static_mean_reward", "policy_mean_reward", "delta"))))
            entry["claim_reproduced"] = rep
        v = T.policy_value(world, valued, pol)
        entry["truth"] = _value(v, objective)
        entry["true_delta"] = {"return_vs_baseline": v.ret - v_base.ret, "return_vs_yaml": v.ret - v_yaml.ret,
                               "objective_vs_baseline": v.objective(objective) - v_base.objective(objective),
                               "objective_vs_yaml": v.objective(objective) - v_yaml.objective(objective)}
        claimed = _sign(float(entry["claim"]["delta"])) if entry["claim"] else None
        true = _sign(entry["true_delta"]["return_vs_baseline"])
        entry["direction"] = {"claimed": claimed, "true": true,
                              "agrees": None if claimed is None or true is None else claimed == true}
        out["checkpoints"][kind] = entry
    work = tools_result.get("work_dir")
    if work and Path(work).is_dir():
        artifacts.write_json(Path(work) / JUDGED_NAME, out)
    return out


def _r(x, nd: int = 4):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


def summary_row(judged: dict) -> dict:
    """The judged night as flat columns (the loop's day row, ``benchmarks/sage_loop_e2e.py``): per SAGE
    checkpoint, SAGE's claimed delta, the rows its mean is over, the true return delta against the data's
    policy, the true objective delta against SAGE's YAML, and whether the directions agree."""
    row: dict[str, Any] = {"SAGE rows": judged.get("rows_exported")}
    for kind, c in (judged.get("checkpoints") or {}).items():
        claim, rep = c.get("claim") or {}, c.get("claim_reproduced") or {}
        td = c.get("true_delta") or {}
        row[f"SAGE {kind} claim delta"] = _r(claim.get("delta"))
        row[f"SAGE {kind} rows agreeing"] = rep.get("rows_counted")
        row[f"SAGE {kind} true return delta"] = _r(td.get("return_vs_baseline"))
        row[f"SAGE {kind} true objective vs YAML"] = _r(td.get("objective_vs_yaml"))
        row[f"SAGE {kind} direction right"] = (c.get("direction") or {}).get("agrees")
        if not c.get("trained"):
            row[f"SAGE {kind} claim delta"] = "not trained"
    return row
