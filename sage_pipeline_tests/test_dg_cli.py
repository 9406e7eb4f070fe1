"""Dagster's ``dg`` CLI (dagster-dg-cli) on the project, as ``[tool.dg]`` in pyproject.toml lays it out:
``dg check defs`` loads it, ``dg list defs`` lists what ``sage_pipeline.definitions`` defines,
``dg launch --assets`` materializes, and ``dg dev`` serves the code location ``make dev`` serves
(workspace.yaml: the module sage_pipeline.definitions, location sage_pipeline).

Each ``dg`` call loads the whole code location (dagster, torch, pandas and every chain: 5-10 s), so the
tests that run one are slow. Every call gets a temporary DAGSTER_HOME and SAGE_DATA_DIR, and
VIRTUAL_ENV set to this interpreter's environment (``dg`` warns when the project's .venv is not the
active one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
import yaml

from sage_pipeline.definitions import defs
from sage_pipeline_tests.ui import _support as sup

DG = Path(sys.executable).parent / "dg"
DG_TIMEOUT_S = 300  # a guard for a hung call on two shared cores, never the thing asserted
SERVER_START_TIMEOUT_S = 240
# the decision ledger's report: on an empty data root it reads no ledger and writes nothing but its
# materialization (under a second of work; the launch's cost is loading the code location)
CHEAP_ASSET = dg.AssetKey(["decisions", "decision_ledger"])

# `dg dev` with SIGINT at its default: a parent started in the background by a shell ignores SIGINT, the
# child would inherit that, and dagster dev shuts down on SIGTERM through its SIGINT handler.
LAUNCH = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
          "os.execv(sys.argv[1], sys.argv[1:])")

WORKSPACE_QUERY = """{ workspaceOrError { __typename
  ... on Workspace { locationEntries { name loadStatus displayMetadata { key value }
    locationOrLoadError { __typename
      ... on PythonError { message }
      ... on RepositoryLocation { repositories { name jobs { name } assetNodes { assetKey { path } } } } } } }
  ... on PythonError { message } } }"""


def _asset_keys(definitions: dg.Definitions) -> set[str]:
    graph = definitions.resolve_asset_graph()
    return {key.to_user_string() for key in graph.get_all_asset_keys()}


def _env(tmp_path: Path) -> dict[str, str]:
    home, data = tmp_path / "dagster_home", tmp_path / "sage_data"
    home.mkdir(exist_ok=True)
    data.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return {**os.environ, "DAGSTER_HOME": str(home), "SAGE_DATA_DIR": str(data),
            "VIRTUAL_ENV": sys.prefix, "DAGSTER_DISABLE_TELEMETRY": "1"}


def _dg(args: list[str], env: dict[str, str], cwd: Path = sup.REPO) -> subprocess.CompletedProcess:
    assert DG.is_file(), f"{DG} not found: dagster-dg-cli is in pyproject.toml's dev extra (make install)"
    return subprocess.run([str(DG), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=DG_TIMEOUT_S)


def _said(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def test_dg_and_make_dev_resolve_to_the_same_code_location():
    """dg's own reading of pyproject.toml names the module and location that workspace.yaml
    (make dev, dagster dev) and [tool.dagster] name."""
    from dagster_dg_core.context import DgContext

    ctx = DgContext.for_project_environment(sup.REPO, {})
    workspace = yaml.safe_load((sup.REPO / "workspace.yaml").read_text())
    [entry] = [e["python_module"] for e in workspace["load_from"]]
    tool = tomllib.loads((sup.REPO / "pyproject.toml").read_text())["tool"]
    assert ctx.is_project and ctx.root_path == sup.REPO
    assert ctx.code_location_target_module_name == entry["module_name"] == tool["dagster"]["module_name"]
    assert ctx.code_location_name == entry["location_name"] == tool["dagster"]["code_location_name"]
    assert ctx.target_args == {"module_name": "sage_pipeline.definitions"}
    assert ctx.defs_path == sup.REPO / "sage_pipeline" / "defs"


@pytest.mark.slow
def test_dg_check_defs_loads_the_project(tmp_path):
    proc = _dg(["check", "defs"], _env(tmp_path))
    assert proc.returncode == 0, _said(proc)
    assert "All definitions loaded successfully." in proc.stdout, _said(proc)


@pytest.mark.slow
def test_dg_check_defs_fails_on_a_code_location_that_does_not_load(tmp_path):
    """The check can fail: a dg project laid out like this one whose definitions module raises."""
    project = tmp_path / "broken_project"
    (project / "broken_pkg" / "defs").mkdir(parents=True)
    (project / "broken_pkg" / "__init__.py").write_text("")
    (project / "broken_pkg" / "defs" / "__init__.py").write_text("")
    (project / "broken_pkg" / "definitions.py").write_text(
        "import dagster as dg\n\n"
        "@dg.asset\ndef fine() -> None: ...\n\n"
        "raise RuntimeError('definitions module refuses to load: marker 7f3a')\n")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "broken_pkg"\nversion = "0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "broken_pkg"\n')
    proc = _dg(["check", "defs"], _env(tmp_path), cwd=project)
    assert proc.returncode != 0, _said(proc)
    assert "marker 7f3a" in proc.stdout + proc.stderr, _said(proc)
    assert "All definitions loaded successfully." not in proc.stdout


@pytest.mark.slow
def test_dg_list_defs_lists_the_assets_and_jobs_of_the_definitions_module(tmp_path):
    proc = _dg(["list", "defs", "--json"], _env(tmp_path))
    assert proc.returncode == 0, _said(proc)
    listed = json.loads(proc.stdout)
    keys = {a["asset_key"] for a in listed["assets"]}
    assert keys == _asset_keys(defs), (f"only dg: {sorted(keys - _asset_keys(defs))}; "
                                       f"only sage_pipeline.definitions: {sorted(_asset_keys(defs) - keys)}")
    assert len(keys) >= 20  # the real graph, not an empty one
    jobs = {j["name"] for j in listed["jobs"]}
    assert {"sage_main", "offline_routing", "nightly_sleep"} <= jobs
    assert {r["name"] for r in listed["resources"]} >= {"sage", "sandbox"}


@pytest.mark.slow
def test_dg_launch_materializes_one_asset_into_the_instance(tmp_path):
    env = _env(tmp_path)
    proc = _dg(["launch", "--assets", CHEAP_ASSET.to_user_string()], env)
    assert proc.returncode == 0, _said(proc)
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        event = instance.get_latest_materialization_event(CHEAP_ASSET)
        assert event is not None, f"dg launch exited 0 but {CHEAP_ASSET.to_user_string()} has no materialization"
        meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
    # it ran the project's code against the temporary data root (SAGE_DATA_DIR), not the repo's
    assert meta["ledger_path"] == str(Path(env["SAGE_DATA_DIR"]) / "decisions" / "ledger.json")
    assert meta["exists"] is False and meta["candidates"] == 0
    # and through the project's executor (steps forked from a server that preloaded the definitions)
    assert run.job_name == "__ASSET_JOB"
    assert "multiprocess" in proc.stdout + proc.stderr


def _graphql(base: str, query: str) -> dict:
    req = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["data"]


def _loaded_location(proc: subprocess.Popen, base: str, log_path: Path) -> dict:
    """The location entry once LOADED; fails with the server log's tail when the server exits,
    the location fails to load, or time runs out."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"`dg dev` exited with code {proc.returncode} before serving; log {log_path}:\n"
                                 + log_path.read_text(errors="replace")[-4000:])
        try:
            ws = _graphql(base, WORKSPACE_QUERY)["workspaceOrError"]
        except OSError as e:  # connection refused while starting
            last = str(e)
            time.sleep(0.5)
            continue
        entries = {e["name"]: e for e in ws.get("locationEntries", [])}
        entry = entries.get("sage_pipeline")
        if entry and entry["loadStatus"] == "LOADED":
            loaded = entry["locationOrLoadError"] or {}
            assert loaded.get("__typename") == "RepositoryLocation", f"the code location failed to load: {loaded}"
            return entry
        last = f"locations: {sorted(entries)}"
        time.sleep(0.5)
    raise AssertionError(f"`dg dev` not ready after {SERVER_START_TIMEOUT_S} s ({last}); log {log_path}:\n"
                         + log_path.read_text(errors="replace")[-4000:])


@pytest.mark.slow
def test_dg_dev_serves_the_code_location_make_dev_serves(tmp_path):
    """`dg dev -h 127.0.0.1 -p <free port>` in its own process group, stopped by PID and process group
    (never by name): the UI's GraphQL serves location sage_pipeline from the module workspace.yaml
    names, with the Definitions' asset keys and jobs."""
    port = sup.free_port()
    log_path = sup.artifacts_dir("dg") / "dg_dev.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(DG), "dev", "-h", "127.0.0.1", "-p", str(port)],
                                cwd=sup.REPO, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        entry = _loaded_location(proc, f"http://127.0.0.1:{port}", log_path)
    finally:
        sup.stop_process_group(proc)
    assert not sup.group_members(proc.pid), "dg dev left processes behind"
    workspace = yaml.safe_load((sup.REPO / "workspace.yaml").read_text())
    [make_dev] = [e["python_module"] for e in workspace["load_from"]]
    shown = {m["key"]: m["value"] for m in entry["displayMetadata"]}
    assert entry["name"] == make_dev["location_name"]
    assert shown.get("module_name") == make_dev["module_name"], shown
    [repo] = entry["locationOrLoadError"]["repositories"]
    served = {"/".join(node["assetKey"]["path"]) for node in repo["assetNodes"]}
    assert served == _asset_keys(defs), (f"only served: {sorted(served - _asset_keys(defs))}; "
                                         f"only defined: {sorted(_asset_keys(defs) - served)}")
    assert {j["name"] for j in repo["jobs"]} >= {j.name for j in defs.jobs}
