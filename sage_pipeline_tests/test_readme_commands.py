"""Every command in the README's bash blocks is run by a test or by CI, and this file says which (issue 50).

A command is known by its first words (``make run``, ``dagster asset materialize``); :data:`OWNERS` names, for
each, the line of ``.ci/run`` or the test that runs it. The test fails on a README command nobody runs, on an owner
that is gone (a test renamed, a CI line changed), and on an owner of a command the README no longer has."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from sage_pipeline_tests.ui import _support as sup

CI = "ci"
# command -> (where: "ci" or a test file, what: the .ci/run line or the test function's name)
OWNERS: dict[str, tuple[str, str]] = {
    "make run": (CI, "make run RUN_ARGS=--cli"),  # SAGE_SRC set there: the live-SAGE-day form too
    "make test": (CI, "make test"),  # SAGE_SRC exported: `make test SAGE_SRC=...` as the README gives it
    "make lint": (CI, "make lint"),
    "make sage-contract": (CI, "make test"),  # the same pytest -m sage_contract tests, inside the whole suite
    "make dev": ("ui/test_browser.py", "test_asset_graph_shows_assets_and_latest_materializations"),  # the recipe's
    "make test-fast": ("test_readme_commands.py", "test_make_test_fast_selects_tests_and_leaves_out_the_slow_ones"),
    "make config-docs": ("test_config_reference.py", "test_docs_configuration_md_is_what_the_generator_writes"),
    "make decisions-e2e": ("test_decision_e2e_sage.py", "nights"),  # ledger_nights.run, as the target, 2 nights x 6
    "python -m sage_pipeline.sleep": ("sleep/test_cli.py",
                                      "test_status_shows_the_live_version_its_shas_and_how_to_deploy_it"),
    # the path from your SAGE to a deployed bundle, run as written
    ". .venv/bin/activate": ("test_readme_path.py", "test_the_readmes_path_to_a_deployed_bundle_runs_as_written"),
    "export": ("test_readme_path.py", "test_the_readmes_path_to_a_deployed_bundle_runs_as_written"),
    "cat": ("test_readme_path.py", "test_the_readmes_path_to_a_deployed_bundle_runs_as_written"),
    "dagster asset materialize": ("test_readme_path.py", "test_the_readmes_path_to_a_deployed_bundle_runs_as_written"),
    "python -m sage_pipeline.sage.bundle": ("test_readme_path.py",
                                            "test_the_readmes_path_to_a_deployed_bundle_runs_as_written"),
    ". ~/sage-deploy/sage.env": ("test_readme_path.py", "test_the_readmes_path_to_a_deployed_bundle_runs_as_written"),
}
PREFIXES = sorted(OWNERS, key=len, reverse=True)  # the longest match names a command


def readme_commands() -> list[str]:
    """The commands of the README's bash blocks: every line that starts one (heredoc bodies and continuation lines
    left out), comments cut."""
    text = (sup.REPO / "README.md").read_text()
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        heredoc, continued = None, False
        for raw in block.splitlines():
            line = raw.split("  #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
            if heredoc is not None:
                heredoc = None if raw.strip() == heredoc else heredoc
                continue
            if continued or not line.strip():
                continued = line.endswith("\\")
                continue
            out.append(line.strip())
            continued = line.endswith("\\")
            m = re.search(r"<<'?(\w+)'?", line)
            heredoc = m.group(1) if m else None
    return out


def owner_of(command: str) -> str | None:
    return next((p for p in PREFIXES if command == p or command.startswith(p + " ")), None)


def _defined(test_file: str) -> set[str]:
    tree = ast.parse((sup.REPO / "sage_pipeline_tests" / test_file).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_readme_command_has_an_owner_that_exists():
    commands = readme_commands()
    assert "make run" in commands and "make test" in commands, commands
    unowned = [c for c in commands if owner_of(c) is None]
    assert not unowned, f"README commands no test or CI line runs (add one, and name it in OWNERS): {unowned}"
    ci = (sup.REPO / ".ci" / "run").read_text().splitlines()
    for prefix, (where, what) in OWNERS.items():
        if where == CI:
            assert what in [ln.strip() for ln in ci], f"{prefix}: .ci/run has no line {what!r}"
        else:
            assert what in _defined(where), f"{prefix}: {where} defines no {what}"
    used = {owner_of(c) for c in commands}
    assert set(OWNERS) <= used, f"OWNERS names commands the README no longer has: {set(OWNERS) - used}"


def test_the_readme_parser_reads_commands_not_heredocs_or_continuations():
    assert "make sage-contract SAGE_SRC=<a SAGE checkout>" in readme_commands()
    assert not [c for c in readme_commands() if c.startswith(("ops:", "--sage-python", "trajectories:"))]
    assert owner_of("make test-fast") == "make test-fast" and owner_of("make testify") is None


def test_make_dev_is_the_command_the_browser_test_serves():
    recipe = (sup.REPO / "Makefile").read_text().split("\ndev: install\n", 1)[1].split("\n\n", 1)[0]
    assert "dagster dev -w workspace.yaml" in recipe, recipe
    assert '"dev", "-h", "127.0.0.1"' in (sup.REPO / "sage_pipeline_tests" / "ui" / "test_browser.py").read_text()


def test_make_test_fast_selects_tests_and_leaves_out_the_slow_ones():
    """The target's marker expression, collected: tests are left, none of them slow or needing a service."""
    recipe = (sup.REPO / "Makefile").read_text().split("\ntest-fast: install\n", 1)[1].split("\n", 1)[0]
    expr = re.search(r'-m "([^"]+)"', recipe).group(1)
    assert expr == "not docker and not browser and not postgres and not slow", recipe
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", expr, "sage_pipeline_tests/test_readme_commands.py",
                           "sage_pipeline_tests/test_materialize_all.py"], cwd=sup.REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert "sage_pipeline_tests/test_readme_commands.py::test_every_readme_command_has_an_owner_that_exists" in ids
    assert not [i for i in ids if "test_a_step_in_process" in i or "test_make_test_fast" in i], ids  # slow: out
