"""sleep_cycle/sage_skills in Dagster: wired into the nightly job; with embedded off and nothing configured it says
so and succeeds without creating anything; with nothing configured it reads the embedded week (here a week made of
the committed journals); configured (here through $SAGE_WORKSPACES, on the committed journals of SAGE's own
`sage run`, whose workspaces lack the test files) it shows the live version's shas, the online check's table and a
night that found no tasks; the run config is the core's settings."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.definitions import defs
from sage_pipeline.defs import sleep_assets as sa
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.sage import skills as sk
from sage_pipeline.sleep.sage_night import NOT_CONFIGURED, SageSkillsSettings, live_skills
from sage_pipeline.sleep.sage_skills import SageSkillsRoot

FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_world_run"
NODE = "sleep_cycle__sage_skills"


def _run(root: Path, partition: str = "2026-11-27", config: dict | None = None):
    return dg.materialize([sa.sage_skills], partition_key=partition,
                          run_config={"ops": {NODE: {"config": config}}} if config else None,
                          resources={"sage": SageResource(data_dir=str(root))},
                          instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def _meta(result) -> dict:
    (mat,) = result.asset_materializations_for_node(NODE)
    return {k: v.value for k, v in mat.metadata.items()}


def _check(result) -> dg.AssetCheckEvaluation:
    return next(e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION")


@pytest.fixture
def no_sage_env(monkeypatch):
    for name in ("SAGE_WORKSPACES", "SAGE_JOURNALS", "SAGE_GOAL_LEDGERS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_asset_is_a_night_of_the_nightly_job():
    node = defs.resolve_asset_graph().get(sa.KEY)
    assert node.group_name == "sleep_cycle" and node.pools == {"sleep_cycle"} and node.partitions_def == sa.NIGHTS
    assert sa.KEY in defs.resolve_job_def("nightly_sleep").asset_layer.executable_asset_keys
    assert sa.KEY not in defs.resolve_job_def("sage_main").asset_layer.executable_asset_keys
    (spec,) = sa.sage_skills.check_specs
    assert spec.name == sa.CHECK and spec.blocking


@pytest.mark.slow  # materializes in process (about 3 s)
def test_with_embedded_off_and_nothing_configured_it_says_so_and_succeeds(tmp_path, no_sage_env):
    result = _run(tmp_path, config={"embedded": False})
    assert result.success
    m = _meta(result)
    assert m["status"] == "not_configured" and m["message"] == NOT_CONFIGURED
    assert "nothing to harvest" in m["message"] and m["live_version"] == "-"
    check = _check(result)
    assert check.passed and NOT_CONFIGURED in check.description
    assert not (tmp_path / "sleep").exists()  # nothing created


@pytest.mark.slow  # materializes in process, reads SAGE's journals (about 6 s)
def test_configured_it_shows_the_live_version_the_online_check_and_the_night(tmp_path, no_sage_env):
    spaces = [shutil.copytree(FIXTURE / ws, tmp_path / "sage" / ws) for ws in ("ws-0", "ws-1")]
    no_sage_env.setenv("SAGE_WORKSPACES", ":".join(str(s) for s in spaces))
    result = _run(tmp_path / "data", config={"sandbox": "local"})
    assert result.success
    m = _meta(result)
    root = SageSkillsRoot(tmp_path / "data" / "sleep" / "sage_skills")
    assert m["status"] == "no_tasks" and m["live_version"] == f"v1={root.live()}"
    for sid, sha in root.shas().items():
        assert f"| {sid} | {sha} |" in m["skills"]
    assert m["deploy"] == f"export SAGE_SKILLS_ROOT={root.live_path()}"
    assert "no edit of the skills root to check yet" in m["online_check"] and m["rollbacks"] == 0
    assert f"v1={root.live()}" in m["online_versions"] and sk.INJECTED_IDS[1] in m["online_versions"]
    # the runs (2026-11-28) are after the night of 2026-11-27: not harvested; the online check reads every run
    assert m["harvest"]["sessions"] == 0 and m["harvest"]["outside_window"] == 6 and m["harvest"]["tasks"] == 0
    assert Path(m["diagnostics"]).is_file() and _check(result).passed
    assert live_skills(root.folder) == root.live_path() and live_skills(tmp_path / "none") is None


@pytest.mark.slow  # materializes in process, reads SAGE's journals (about 6 s)
def test_with_nothing_configured_the_night_reads_the_embedded_week(tmp_path, no_sage_env):
    from sage_pipeline.sage import week as wk

    spaces = tmp_path / "week" / "workspaces" / "day-01"
    for ws in ("ws-0", "ws-1"):
        shutil.copytree(FIXTURE / ws, spaces / ws)
    week = wk.Week(root=tmp_path / "week", journals=tmp_path / "week" / "workspaces",
                   workspaces=tmp_path / "week" / "workspaces", days=("day-01",), manifest={"format": 1})
    no_sage_env.setattr(wk, "embedded_week", lambda data_dir: week)
    result = _run(tmp_path / "data", partition="2026-11-28", config={"sandbox": "local"})
    assert result.success
    m = _meta(result)
    root = SageSkillsRoot(tmp_path / "data" / "sleep" / "sage_skills")
    assert m["inputs"].startswith("embedded week") and m["live_version"] == f"v1={root.live()}"
    assert m["harvest"]["sessions"] == 6  # every run of the week's day read (no goal ledger: no task)
    assert m["status"] == "no_tasks" and _check(result).passed
    assert "the embedded week ships no goal ledger" in m["message"]


def test_make_runs_nights_are_the_shipped_weeks_days_and_each_night_reads_its_days_so_far(tmp_path, no_sage_env):
    from sage_pipeline.sage.week import embedded_week, load_manifest
    from sage_pipeline.sleep.sage_night import resolve_inputs

    days = load_manifest()["days"]
    assert len(days) >= 5 and sa.default_nights(3) == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert sa.default_nights(100) == [f"2026-11-{i + 1:02d}" for i in range(len(days))]
    with pytest.raises(ValueError, match="must be >= 0"):
        sa.default_nights(-1)
    week = embedded_week(tmp_path)
    s = SageSkillsSettings()
    per_day = {d: sorted(str(p) for p in (week.workspaces / d).glob("ws-*")) for d in week.days}
    first = resolve_inputs(s, tmp_path, "2026-11-01")
    assert first.embedded and list(first.workspaces) == per_day["day-01"] and first.journals is None
    assert "day-01..day-01" in first.source
    third = resolve_inputs(s, tmp_path, "2026-11-03")
    assert list(third.workspaces) == per_day["day-01"] + per_day["day-02"] + per_day["day-03"]
    assert resolve_inputs(s, tmp_path, "2026-10-31").workspaces == ()  # before the week: nothing yet
    assert len(resolve_inputs(s, tmp_path, "2026-12-30").workspaces) == sum(map(len, per_day.values()))
    assert resolve_inputs(SageSkillsSettings(embedded=False), tmp_path, "2026-11-01") is None
    given = resolve_inputs(SageSkillsSettings(workspaces=["/w"]), tmp_path, "2026-11-01")
    assert given.source == "config" and given.workspaces == ("/w",) and not given.embedded


def test_the_run_config_is_the_core_settings(no_sage_env):
    cfg = sa.SageSkillsAssetConfig(workspaces=["/w"], night={"gate": {"samples": 8}, "limits": {"edit_budget": 2}},
                                    online={"alpha": 0.01})
    s = cfg.settings()
    assert isinstance(s, SageSkillsSettings) and s.configured and s.night.gate.samples == 8
    assert s.night.limits.edit_budget == 2 and s.online.alpha == 0.01 and s.night.role == "coder"
    assert sa.SageSkillsAssetConfig().settings().model_dump() == SageSkillsSettings().model_dump()
    assert not SageSkillsSettings().configured


@pytest.mark.slow  # materializes in process (about 4 s)
def test_the_bundle_carries_the_live_version_of_the_projects_skills_root_when_there_is_one(tmp_path):
    from sage_pipeline.defs.bundle_assets import sage_bundle
    from sage_pipeline.sage import bundle as bd

    def bundle(root: Path):
        root.mkdir(parents=True, exist_ok=True)
        res = dg.materialize([sage_bundle], resources={"sage": SageResource(data_dir=str(root))},
                             instance=dg.DagsterInstance.ephemeral())
        (mat,) = res.asset_materializations_for_node("sage_bundle")
        return bd.read(mat.metadata["bundle_path"].value), mat.metadata["why"].value

    b, why = bundle(tmp_path / "bare")
    assert b.manifest["parts"]["skills"] is None and "skills: SAGE's own" in why
    skills = SageSkillsRoot(tmp_path / "data" / "sleep" / "sage_skills")
    tdd = "discipline/test-driven-development/SKILL.md"
    skills.commit({tdd: skills.text("live", tdd) + "\n- Run the tests before you answer.\n"}, "a night's edit")
    b, why = bundle(tmp_path / "data")
    assert b.manifest["parts"]["skills"] is not None and f"live version {skills.live()}" in why
    assert (b.folder / "skills" / tdd).read_text(encoding="utf-8") == skills.text("live", tdd)
