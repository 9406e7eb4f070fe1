"""Every entry point names ``sage_pipeline.definitions``, and Dagster finds exactly one
Definitions object there (``-m`` refuses a module with two)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import dagster as dg
import yaml

import sage_pipeline.definitions as definitions
from sage_pipeline_tests.ui import _support as sup

MODULE = "sage_pipeline.definitions"


def test_the_definitions_module_holds_one_definitions_object():
    found = sorted(name for name, value in vars(definitions).items() if isinstance(value, dg.Definitions))
    assert found == ["defs"], f"{MODULE} must hold one Definitions object at module scope, found {found}"


def test_every_entry_point_names_the_definitions_module():
    workspace = yaml.safe_load((sup.REPO / "workspace.yaml").read_text())
    assert [e["python_module"]["module_name"] for e in workspace["load_from"]] == [MODULE]
    pyproject = tomllib.loads((sup.REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["dagster"]["module_name"] == MODULE
    # the README and every page of docs/ (the README's sections moved there: issue 50)
    docs = sorted(str(p.relative_to(sup.REPO)) for p in (sup.REPO / "docs").glob("*.md"))
    assert "docs/scaling.md" in docs and "docs/routing.md" in docs, docs
    for path in ["scripts/materialize_all.sh", "scripts/run_summary.py", "README.md", "CHANGELOG.md", *docs]:
        text = (sup.REPO / path).read_text()
        bare = re.findall(r"-m sage_pipeline(?![.\w])", text)
        assert not bare, f"{path}: `-m sage_pipeline` finds no Definitions; name {MODULE}"


def test_the_package_itself_imports_no_dagster():
    code = ("import sys, sage_pipeline, sage_pipeline.rl; "
            "bad = [m for m in ('dagster', 'great_expectations') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_steps_fork_from_a_server_that_preloaded_the_definitions():
    """The default executor: Dagster's multiprocess executor, forkserver start, this module preloaded
    (what makes a step start in under a second); max_concurrent stays the user's to set."""
    assert definitions.defs.executor.name == "multiprocess_forkserver"
    assert definitions._forkserver({"max_concurrent": 3}) == {
        "start_method": {"forkserver": {"preload_modules": [MODULE]}}, "max_concurrent": 3}
    job = definitions.defs.resolve_job_def("offline_routing")
    assert job.executor_def.name == "multiprocess_forkserver"
    assert set(job.executor_def.config_schema.as_field().config_type.fields) == {"max_concurrent"}
