"""What a night leaves behind: ``nights/<date>/diagnostics.json``, ``report.md``, the plot of
scores across stored nights, the quarantine and, when not written live, the candidate.
Also the markdown tables the Dagster metadata shows."""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sage_pipeline import artifacts, markdown
from sage_pipeline.sleep.cycle import ERROR_STATUSES, NightResult
from sage_pipeline.sleep.store import StoreError

MAX_TASK_ROWS = 80


def night_dir(skill_root: Path, date: str) -> Path:
    return skill_root / "nights" / date


def load_history(skill_root: Path) -> list[dict]:
    """date, status and scores of every stored night of a skill, oldest first."""
    out = []
    for p in sorted((skill_root / "nights").glob("*/diagnostics.json")):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            continue
        s = d.get("scores", {})
        picked = {k: (s.get(k) or {}).get("score") for k in ("baseline_val", "candidate_val", "test_before",
                                                              "test_after")}
        out.append({"date": d.get("date", p.parent.name), "status": d.get("status", "?"), **picked,
                    "version": (d.get("versions") or {}).get("after") or (d.get("versions") or {}).get("before")})
    return out


def plot_scores(history: list[dict], skill: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 2.8), dpi=72)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.9, bottom=0.22)
    x = list(range(len(history)))
    for key, style, label in (("baseline_val", "o-", "val (baseline)"), ("test_after", "s-", "test (after the night)")):
        ys = [h[key] if h[key] is not None else float("nan") for h in history]
        ax.plot(x, ys, style, label=label, ms=4)
    acc = [(i, h["candidate_val"]) for i, h in enumerate(history) if h["status"] == "accepted" and h["candidate_val"]]
    if acc:
        ax.scatter([a for a, _ in acc], [b for _, b in acc], marker="^", color="tab:green", zorder=3,
                   label="val (accepted candidate)")
    bad = [i for i, h in enumerate(history) if h["status"] in (*ERROR_STATUSES, "running")]
    if bad:
        ax.scatter(bad, [0.0] * len(bad), marker="x", color="tab:red", zorder=3,
                   label="night failed or never finished")
    ax.set_xticks(x)
    ax.set_xticklabels([h["date"][5:] for h in history], rotation=45, fontsize=7)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("score")
    ax.set_title(f"sleep cycle: {skill}, {len(history)} night(s)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72)  # fixed layout: a "tight" bbox would draw the figure twice
    plt.close(fig)
    return buf.getvalue()


def score_rows(r: NightResult) -> list[dict]:
    labels = {"baseline_val": "val, baseline", "candidate_val": "val, candidate", "train": "train, baseline",
              "test_before": "test, before (scored after the decision)", "test_after": "test, after"}
    return [{"split": lab, **{k: (r.scores.get(key) or {}).get(k) for k in ("score", "hard", "soft", "tasks")}}
            for key, lab in labels.items()]


def edit_rows(edits: list[dict]) -> list[dict]:
    return [{"op": e["op"], "target": e["target"], "content": e["content"][:120], "anchor": e["anchor"][:80],
             "status": e["status"], "why": e["reason"][:160]} for e in edits]


def task_rows(r: NightResult, limit: int = MAX_TASK_ROWS) -> list[dict]:
    rows = [x for x in r.per_task if x["phase"] in ("val baseline", "test before", "test after")]
    rows += [x for x in r.per_task if x["phase"] not in ("val baseline", "test before", "test after")]
    return [{"phase": x["phase"], "task": x["task_id"], "hard": x["hard"], "soft": x["soft"],
             "response head": " ".join(x["response_head"].split())[:70], "why it failed": x["why"][:110]}
            for x in rows[:limit]]


def edit_groups(r: NightResult) -> dict[str, list[dict]]:
    return {"accepted": r.edits_with("accepted"),
            "rejected": [e for e in r.edits if e["status"] not in ("accepted", "unmatched")],
            "unmatched": r.edits_with("unmatched")}


def report_markdown(r: NightResult, image_md: str = "") -> str:
    g = edit_groups(r)
    out = [f"# Sleep cycle: {r.skill}, night {r.date}", "",
           f"**Status: {r.status}** (gate action: {r.gate_action}). {r.reason}"]
    if r.status in ERROR_STATUSES:
        out += ["", f"**This night failed** (started {r.started_at}, stopped {r.finished_at}): the scores below are "
                "only what it measured before it stopped; nothing after that is guessed."]
    if r.cause:
        out += ["", f"**Cause** ({r.phase or 'setup'}): `{r.cause}`"]
    out += ["", (f"Versions: before `{r.versions.get('before') or '-'}`, after `{r.versions.get('after') or '-'}`. "
                 f"Backend: {r.backend.get('name', '?')}. Took {r.seconds:.1f} s."), "", "## Scores", "",
            markdown.table(score_rows(r))]
    for name in ("accepted", "rejected", "unmatched"):
        out += ["", f"## {name.capitalize()} edits ({len(g[name])})", "", markdown.table(edit_rows(g[name]))]
    if r.trials:
        out += ["", "## Gate trials", "", markdown.table([
            {"trial": i + 1, "edits": "; ".join(t["edits"])[:120], "baseline": t["baseline"],
             "candidate": t["candidate"], "verdict": t["verdict"], "regressed": ", ".join(t["regressed"][:4])}
            for i, t in enumerate(r.trials)])]
    if r.val_changes["regressed"]:
        out += ["", f"**Val tasks that got worse despite the accepted mean**: {', '.join(r.val_changes['regressed'])}"]
    head = r.reflect.get("reply_head") or ""
    out += ["", "## Reflect reply (head)", "", "```", head[:600] or "(no reply)", "```"]
    if r.reflect.get("error"):
        out += ["", f"Reflect reply error: {r.reflect['error']}"]
    c = r.calls or {}
    out += ["", "## Backend calls", "", (f"{c.get('calls', 0)} calls, {c.get('total_tokens', 0):,} tokens "
                                         f"({c.get('prompt_tokens', 0):,} prompt, {c.get('completion_tokens', 0):,} "
                                         f"completion), {c.get('cache_hits', 0)} cache hits, "
                                         f"{c.get('retries', 0)} retries."), "",
            markdown.table([{"purpose": p, **v} for p, v in (c.get("by_purpose") or {}).items()])]
    if r.call_errors:
        out += ["", f"### Call errors ({len(r.call_errors)})", "", markdown.table(r.call_errors[:30])]
    h = r.harvest or {}
    out += ["", "## Tasks", "", (f"{r.tasks.get('total', 0)} tasks: train {r.tasks.get('train', 0)}, val "
                                 f"{r.tasks.get('val', 0)}, test {r.tasks.get('test', 0)}; sources "
                                 f"{h.get('sources', {})}; {h.get('unusable', 0)} unusable (no reference), "
                                 f"{len(r.quarantined)} quarantined.")]
    if r.quarantined:
        out += ["", markdown.table(r.quarantined[:20])]
    if r.unusable:
        out += ["", "Unusable (first ones):", "", markdown.table(r.unusable[:10])]
    if r.notes:
        out += ["", "Notes: " + "; ".join(r.notes)]
    out += ["", "## Per task", "", markdown.table(task_rows(r))]
    if r.traceback:
        out += ["", "## Traceback", "", "```", r.traceback.rstrip(), "```"]
    if image_md:
        out += ["", "## Scores per night", "", image_md]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class NightFiles:
    folder: Path
    diagnostics: Path
    report: Path
    scores_png: Path
    png: bytes  # the plot, for embedding in metadata
    extra: dict[str, Path]  # quarantine, staged candidate documents


def started_markdown(r: NightResult, lock: Path) -> str:
    return "\n".join([
        f"# Sleep cycle: {r.skill}, night {r.date}", "",
        f"**Status: running** since {r.started_at} (pid {os.getpid()}). This night has not finished. If no "
        f"night of this skill runs now (its lock file `{lock}` is empty when none does), it was killed before "
        "it could write its result: nothing here is a result of this night.", "",
        "An earlier run of this night, if there was one, is in `previous/`."]) + "\n"


def write_started(r: NightResult, skill_root: Path) -> Path:
    """Before a night does anything: ``nights/<date>/`` says it is running, so a night that dies
    without writing its result never leaves an earlier run's report looking like this one. The
    earlier run's files move to ``nights/<date>/previous/`` (one generation is kept)."""
    d = night_dir(skill_root, r.date)
    for p in (d.parent, d):
        if p.exists() and not p.is_dir():
            raise StoreError(f"{p}: is a file where the folder of the nights' reports and diagnostics belongs "
                             f"(night {r.date} of {r.skill}): move it away (or delete it), then run the night again")
    if d.is_dir():
        for folder in [d, *(p for p in d.iterdir() if p.is_dir() and p.name != "previous")]:
            artifacts.sweep_temp_files(folder)  # a killed night's half-written files are no result
        earlier = [p for p in d.iterdir() if p.name != "previous"]
        if earlier:
            prev = d / "previous"
            shutil.rmtree(prev, ignore_errors=True)
            prev.mkdir()
            for p in earlier:
                os.replace(p, prev / p.name)
    marker = {**r.to_dict(), "status": "running",
              "reason": "started, not finished: if this is still here, the night was killed before its end"}
    artifacts.write_json(d / "diagnostics.json", marker)
    return artifacts.write_text(d / "report.md", started_markdown(r, skill_root / ".night.lock"))


def write_night(r: NightResult, skill_root: Path) -> NightFiles:
    """diagnostics.json, report.md (with scores.png beside it), quarantine and staged candidate."""
    d = night_dir(skill_root, r.date)
    diagnostics = artifacts.write_json(d / "diagnostics.json", r.to_dict())
    extra = {}
    if r.quarantined:
        extra["quarantine"] = artifacts.write_text(
            d / "quarantine.jsonl", "".join(json.dumps(q) + "\n" for q in r.quarantined))
    for target, text in r.candidate.items():
        extra[f"candidate_{target}"] = artifacts.write_text(d / "candidate" / f"{target.upper()}.md", text)
    png = plot_scores(load_history(skill_root), r.skill)
    scores = artifacts.write_bytes(d / "scores.png", png)
    report = artifacts.write_text(d / "report.md", report_markdown(r, "![scores per night](scores.png)"))
    return NightFiles(d, diagnostics, report, scores, png, extra)
