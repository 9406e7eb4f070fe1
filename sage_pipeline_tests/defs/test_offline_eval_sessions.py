"""offline_eval on journal sets of few sessions a day (issue 32): SAGE without SAGE_SESSION_ID writes one
session per journal file, a day, so a few hundred decisions can be a dozen sessions. The asset must
complete on any such set, and each space's report either gives an interval or says how many sessions it
has and needs; the gate then refuses with that sentence.

Before: 1 session a day crashed cql_policy or offline_eval ("cross-fitting needs at least 2 sessions",
"empty dataset" on an empty select half), and where it ran the report half's 3-4 sessions gave 95%
intervals narrow enough to promote."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.definitions import ROUTING_ASSETS
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.rl import offline_eval as oe

SELECTION = [dg.AssetKey(k) for k in ("synthetic_sessions", "trajectories", "routing_dataset", "reward_report",
                                      "bc_policy", "cql_policy", "offline_eval", "promoted_policy")]


def _run(root: Path, episodes: int, per_day: int, tasks: float, seed: int):
    run_config = {"ops": {
        "synthetic_sessions": {"config": {"episodes": episodes, "seed": seed, "sessions_per_day": per_day,
                                          "mean_tasks_per_session": tasks}},
        "cql_policy": {"config": {"steps": 100, "n_boot": 30}},
        "bc_policy": {"config": {"epochs": 3}},
        "offline_eval": {"config": {"n_boot": 100}}}}
    defs = dg.Definitions(assets=ROUTING_ASSETS, resources={"sage": SageResource(data_dir=str(root))})
    return defs.resolve_implicit_global_asset_job_def().execute_in_process(
        run_config=run_config, instance=dg.DagsterInstance.ephemeral(), asset_selection=SELECTION,
        raise_on_error=False)


def _metadata(result, asset: str) -> dict:
    mats = result.asset_materializations_for_node(asset)
    assert mats, f"{asset} was not materialized"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def _failures(result) -> list[str]:
    out = []
    for e in result.all_events:
        if e.event_type_value == "STEP_FAILURE":
            err = e.event_specific_data.error
            while err.cause:
                err = err.cause
            out.append(f"{e.step_key}: {err.message.strip()[-300:]}")
    return out


# (episodes, sessions a day, mean tasks a session, seed): each a few hundred decisions; the seeds are ones
# that crashed before (1 a day: seed 4 in offline_eval's cross-fitting, 200 episodes / seed 2 an empty
# select half in cql_policy)
CASES = {"1_a_day": (300, 1, 20.0, 4), "1_a_day_empty_select": (200, 1, 60.0, 2), "2_a_day": (300, 2, 10.0, 3),
         "5_a_day": (300, 5, 4.0, 1),
         "one_session_no_eval_split": (60, 1, 60.0, 1)}  # the day's one session is in the train split


@pytest.mark.parametrize("case", list(CASES))
def test_offline_eval_completes_and_gives_an_interval_or_says_why(tmp_path, case):
    episodes, per_day, tasks, seed = CASES[case]
    result = _run(tmp_path, episodes, per_day, tasks, seed)
    assert result.success, _failures(result)
    meta = _metadata(result, "offline_eval")
    report = json.loads((tmp_path / "reports" / "offline_eval.json").read_text())
    assert (tmp_path / "reports" / "offline_eval.png").is_file()
    decision = json.loads((tmp_path / "checkpoints" / "gate" / "decision.json").read_text())
    for space in meta["action_spaces"]:
        rep, sfx = report[space], "" if space == "multi_model" else f"_{space}"
        n = rep["sessions"]["n_sessions"]
        assert meta[f"sessions{sfx}"] == n and rep["sessions"]["min_sessions"] == oe.MIN_SESSIONS
        if n >= oe.MIN_SESSIONS:
            assert rep["sessions"]["intervals"] == "given"
            continue
        # too few sessions: it says how many it has and needs, gives no interval, and the gate refuses
        unit = "session" if n == 1 else "sessions"
        assert f"{n} {unit}; a 95% interval needs at least {oe.MIN_SESSIONS}" in rep["sessions"]["intervals"]
        assert meta[f"intervals{sfx}"] == rep["sessions"]["intervals"]
        assert all(r.get("ci_low") is None for r in rep["summary"])
        assert f"{n} {unit}" in rep["sample_size_warning"]
        gate = rep["gate"]
        assert gate["promoted"] is None and decision["spaces"][space]["promoted"] is None
        per_night, said = gate["reason"], [c["why"] for c in gate["candidates"].values()] or [gate["reason"]]
        if gate["mode"] == "ledger":  # SAGE's binary space: tonight's candidates pending in the ledger, each with
            # tonight's one-night verdict beside it (valid for one night only), which says what it lacks
            assert gate["candidates"] and all(c["state"] == "pending" and "evidence 1.00 of the" in c["why"]
                                              for c in gate["candidates"].values())
            per_night = meta["promotion_sage_per_night"].split(": ", 1)[1]
            # (a candidate the per-night gate had no row for reads 'None (valid ...)': its reason is the gate's)
            said = [c["per_night"] for c in gate["candidates"].values() if not c["per_night"].startswith("None ")]
            said = said or [per_night]
        # each candidate is refused for want of sessions, or of support, or the table itself has no estimate
        # (then the gate's reason says why, and every candidate that the baseline has none to compare with)
        no_baseline = per_night.startswith("no promotion: the static table has no step_dr_clip estimate")
        assert all(f"{n} {unit}; a 95% interval needs" in w or "no support" in w
                   or (no_baseline and "the baseline static_table has no step_dr_clip estimate to compare with" in w)
                   for w in said), said
        assert rep["support_by_role"] is None if n == 0 else rep["support_by_role"]["roles"]
    assert _metadata(result, "promoted_policy")
