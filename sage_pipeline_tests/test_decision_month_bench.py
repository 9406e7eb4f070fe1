"""benchmarks/decision_month.py still runs (``--quick``): its JSON has every scenario and a null month's
wrong-decision share for each lever is a number in [0, 1]; its batch engine decides exactly as one
``Ledger`` per month on the same months; its sign-flip test and level are the per-night gate's. Figures
and speed are not checked here (they live in docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "benchmarks/decision_month.py"


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("decision_month")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.slow
def test_a_quick_run_has_every_scenario_and_null_shares_in_0_1(tmp_path, bench):
    out = tmp_path / "quick.json"
    printed = run("--quick", "--out", str(out)).stdout
    res = json.loads(out.read_text())
    assert set(res["figures"]) == set(bench.SCENARIOS) == set(res["scenarios"])
    nulls = {"skills/null/40": "any_wrong_accept", "skills/null/20": "any_wrong_accept",
             "coder/null/60": "any_wrong_pin", "router/null/60": "any_wrong_promotion"}
    for scenario, name in nulls.items():
        f = res["figures"][scenario][name]
        assert isinstance(f["value"], float) and 0.0 <= f["value"] <= 1.0, (scenario, f)
        assert f["n"] == res["settings"]["months"] and 0.0 <= f["ci"][0] <= f["value"] <= f["ci"][1] <= 1.0
    assert "| skills/null/40 | months with any wrong accept (ledger) |" in printed


@pytest.mark.slow
def test_the_batch_engine_decides_as_one_ledger_per_month(tmp_path):
    """The same months through the product's Ledger (propose / add_evidence / decide, batch 1) and through
    the vectorised rule: every transition (month, night, candidate, new state) identical, on every lever."""
    events = {}
    for engine in ("ledger", "batch"):
        out = tmp_path / f"{engine}.json"
        run("--quick", "--months", "3", "--engine", engine, "--out", str(out))
        events[engine] = json.loads(out.read_text())["events"]
    assert events["batch"] == events["ledger"]
    states = {e[3] for evs in events["ledger"].values() for e in evs}
    assert {"accepted", "reverted"} <= states  # the comparison covers accepts and reverts, not only quiet months


def test_its_sign_flip_test_is_the_gates_at_the_gates_level(bench):
    from sage_pipeline.sleep.block import EditLimits
    from sage_pipeline.sleep.gate import GateConfig, sign_flip_p

    rng = np.random.default_rng(7)
    for n, k, lift in ((26, 16, 0.1), (13, 16, 0.0), (5, 4, 0.3), (40, 8, -0.05)):
        p = rng.uniform(0.2, 0.8, n)
        d = (rng.binomial(k, np.clip(p + lift, 0, 1)) - rng.binomial(k, p)) / k
        assert bench.sign_flip_p(d, k) == pytest.approx(sign_flip_p(d, GateConfig().permutations)[0], abs=1e-9)
    assert bench.sign_flip_p(np.zeros(5), 16) == 1.0
    src = (ROOT / SCRIPT).read_text()
    assert "level = 0.05 / 4  # GateConfig().alpha / EditLimits().edit_budget" in src
    assert GateConfig().alpha / EditLimits().edit_budget == 0.05 / 4
