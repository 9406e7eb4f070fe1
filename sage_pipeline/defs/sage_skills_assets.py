"""The sleep cycle on SAGE's own skills in Dagster: ``sleep_cycle/sage_skills``, one night per day partition,
in the ``sleep_cycle`` group (so the ``nightly_sleep`` job and its schedule run it with the other nights).

Thin: the work is ``sage_pipeline.sleep.sage_night.run_sage_skills`` (the online check of the deployed edits
on SAGE's journals, the harvest of SAGE's runs, one night on the project's SAGE skills root); this module maps
config in and the outcome out as metadata. The config is the core's ``SageSkillsSettings``, section by section.
With no SAGE workspaces or journals configured (run config, or ``$SAGE_WORKSPACES`` / ``$SAGE_JOURNALS``) the
asset says "no SAGE journals configured: nothing to harvest" and succeeds: the nightly job never fails for it.
"""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import dagster as dg

from sage_pipeline import markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import section
from sage_pipeline.defs.sleep_assets import (
    GROUP,
    NIGHTS,
    POOL,
    EditLimitsSection,
    GateSection,
    OpenAISection,
    SplitSection,
)
from sage_pipeline.sleep.cycle import ERROR_STATUSES
from sage_pipeline.sleep.sage_night import SageNightConfig, SageSkillsOutcome, SageSkillsSettings, run_sage_skills
from sage_pipeline.sleep.sage_online import OnlineCheckConfig

KEY = dg.AssetKey([GROUP, "sage_skills"])
CHECK = "sage_skills_night_completed"


class SageNightSection(dg.Config, SageNightConfig):
    """``sage_pipeline.sleep.sage_night.SageNightConfig``."""

    limits: EditLimitsSection = section(SageNightConfig, "limits", EditLimitsSection)
    gate: GateSection = section(SageNightConfig, "gate", GateSection)
    split: SplitSection = section(SageNightConfig, "split", SplitSection)


class OnlineCheckSection(dg.Config, OnlineCheckConfig):
    """``sage_pipeline.sleep.sage_online.OnlineCheckConfig``."""


class SageSkillsAssetConfig(dg.Config, SageSkillsSettings):
    """The run config of ``sage_skills``: ``sage_pipeline.sleep.sage_night.SageSkillsSettings``."""

    openai: OpenAISection = section(SageSkillsSettings, "openai", OpenAISection)
    night: SageNightSection = section(SageSkillsSettings, "night", SageNightSection)
    online: OnlineCheckSection = section(SageSkillsSettings, "online", OnlineCheckSection)

    def settings(self) -> SageSkillsSettings:
        return SageSkillsSettings.model_validate(self.model_dump())


def _md(rows: list[dict], empty: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(markdown.table(rows) if rows else empty)


def _sandbox(d: dict) -> str:
    """Which backend ran SAGE's tests, and whether unisolated by the override."""
    if not d:
        return "-"
    if d.get("sandbox") == "local":
        return ("local: UNISOLATED, SAGE's model-written tests run by the override allow_untrusted_local"
                if d.get("allow_untrusted_local") else "local (unisolated)")
    return f"{d.get('sandbox')} (isolated{', untrusted code' if d.get('untrusted') else ''})"


def sage_skills_metadata(o: SageSkillsOutcome) -> dict:
    """What the UI shows at a glance: the live version and its per-skill shas, the night's decision, the
    online check's table."""
    n, live = o.night, o.live
    changed = set((n.diff if n else {}) or {})
    meta = {
        "status": n.status if n else "not_configured", "message": o.message, "reason": o.message,
        "live_version": f"v{live['seq']}={live['version']}" if live else "-",
        "live_path": dg.MetadataValue.path(live.get("path", "")) if live else "-",
        "skills": _md([{"skill": s, "sha16": h, "changed tonight": s in changed}
                       for s, h in (live.get("shas") or {}).items()], "no skills root yet"),
        "skills_root": dg.MetadataValue.path(o.root),
        "deploy": (f"export SAGE_SKILLS_ROOT={live['path']}" if live else "-"),
    }
    if o.online is not None:
        meta.update({
            "online_check": o.online.summary(),
            "online_versions": _md(o.online.texts, "no run of SAGE's with the role's skills yet"),
            "online_edits": _md([{k: e[k] for k in ("version", "skill", "runs_new", "verified_new", "runs_parent",
                                                    "verified_parent", "p_value", "decision", "action")}
                                 for e in o.online.edits], "no edit to check"),
            "rollbacks": len(o.online.rollbacks),
        })
    if o.online_error:
        meta["online_error"] = o.online_error
    if n is None:
        return meta
    s = n.scores
    meta.update({
        "decision": n.gate_action, "reason": n.reason, "cause": n.cause or "-",
        "versions": dg.MetadataValue.json(n.versions),
        "scores": _md([{"split": k, **{f: (s.get(k) or {}).get(f) for f in ("score", "hard", "tasks", "samples")}}
                       for k in ("baseline_val", "candidate_val", "train", "test_before", "test_after")], "-"),
        "trials": _md([{"edits": "; ".join(t["edits"])[:140], "baseline": t["baseline"], "candidate": t["candidate"],
                        "verdict": t["verdict"], "p_value": t.get("p_value")} for t in n.trials], "no trial"),
        "edits": _md([{"target": e["target"], "content": e["content"][:120], "status": e["status"],
                       "why": e["reason"][:140]} for e in n.edits], "no edit proposed"),
        "diff": dg.MetadataValue.md("\n".join(f"```diff\n{d}```" for d in n.diff.values()) or "no change"),
        "tasks": dg.MetadataValue.json({k: v for k, v in n.tasks.items() if not k.endswith("_ids")}),
        "harvest": dg.MetadataValue.json({k: o.harvest.get(k) for k in ("sessions", "outside_window", "tasks",
                                                                          "validated", "reasons", "missing",
                                                                          "unsafe")}),
        "sandbox": _sandbox(n.sandbox),
        "diagnostics": dg.MetadataValue.path(n.diagnostics),
    })
    if n.ledger:  # ledger mode: every skill candidate's standing (the decisions/decision_ledger asset shows all levers)
        meta["ledger"] = _md([{"candidate": c["id"], "change": (c.get("change") or c["key"])[:90], "state": c["state"],
                               "estimate": c["estimate"], "interval": "—" if c["interval"][0] is None else
                               f"[{c['interval'][0]:+.3f}, {c['interval'][1]:+.3f}]", "standing": c["standing"],
                               "why": c["history"][-1]["reason"][:140] if c["history"] else ""}
                              for c in n.ledger.get("candidates", [])], "no candidate yet")
        meta["ledger_guarantee"] = n.ledger.get("guarantee", "-")
        plan = n.ledger.get("plan")
        meta["next_plan"] = dg.MetadataValue.json(plan if isinstance(plan, dict) else {"plan": str(plan or "-")})
    return meta


def _check(o: SageSkillsOutcome) -> dg.AssetCheckResult:
    status = o.night.status if o.night else "not_configured"
    return dg.AssetCheckResult(
        check_name=CHECK, asset_key=KEY, passed=o.healthy,
        severity=dg.AssetCheckSeverity.ERROR if status in ERROR_STATUSES else dg.AssetCheckSeverity.WARN,
        description=o.message + (f" Cause: {o.night.cause}" if o.night and o.night.cause else ""),
        metadata={"status": status})


@dg.asset(key=KEY, group_name=GROUP, partitions_def=NIGHTS, pool=POOL, kinds={"python", "markdown"},
          description="One night of the sleep cycle on SAGE's own skills: the online check of the deployed edits on "
                      "SAGE's journals (an edit that hurt beyond chance is rolled back), the harvest of SAGE's runs "
                      "(tasks judged by the tests SAGE's test engineer wrote), the coder replayed as SAGE would with "
                      "the candidate skills injected, a paired test on a val slice drawn afresh each night, an "
                      "accepted edit committed as the live version of sleep/sage_skills (SAGE_SKILLS_ROOT). Says "
                      "'no SAGE journals configured: nothing to harvest' when none are.",
          check_specs=[dg.AssetCheckSpec(CHECK, asset=KEY, blocking=True,
                                         description="Fails when the night on SAGE's skills could not do its job: a "
                                                     "backend, judge, store or input error or a bug (ERROR, blocking) "
                                                     "or a conflict or unusable reflect reply (WARN). Passes when "
                                                     "nothing is configured.")])
def sage_skills(context: dg.AssetExecutionContext, config: SageSkillsAssetConfig,
                sage: SageResource) -> dg.MaterializeResult:
    window = context.partition_time_window
    o = run_sage_skills(sage.root(), context.partition_key, (window.start, window.end), config.settings(),
                        log=context.log.info)
    if not o.configured:
        context.log.info(o.message)
    elif not o.healthy:
        context.log.error(f"sage_skills {context.partition_key}: {o.message}")
    return dg.MaterializeResult(metadata=sage_skills_metadata(o), check_results=[_check(o)])


sage_skills_defs = dg.Definitions(assets=[sage_skills])
