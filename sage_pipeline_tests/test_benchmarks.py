"""The benchmark scripts still run: every one parses its arguments (its imports load), and the
two that exercise the most core APIs (the offline chain's quality and the simulated month) run
a tiny case end to end and write their results. Figures are not checked here (they live in
docs/benchmarks.md); breakage is: a benchmark that no test ran once stopped running unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))  # _cli: shared


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stderr[-3000:]}"
    return out


def test_there_are_benchmarks():
    assert {"offline_quality.py", "closed_loop.py", "ppo_vs_sb3.py", "env_speed.py"} <= set(SCRIPTS)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_parses_its_arguments(script):
    assert "usage:" in run(f"benchmarks/{script}", "--help", timeout=120).stdout


@pytest.mark.slow
def test_offline_quality_runs_a_seed_with_its_clip_sweep(tmp_path):
    out = tmp_path / "oq.json"
    run("benchmarks/offline_quality.py", "--seeds", "1", "--workers", "1", "--episodes", "3000",
        "--action-space", "sage_binary", "--clip-factors", "1.5", "inf", "--out", str(out))
    res = json.loads(out.read_text())
    (r,) = res["runs"]
    rows = {(e["policy"], e["estimator"]): e for e in r["estimates"]}
    # the sweep's 1.5 is the report's clipped step-wise DR, and inf its plain step-wise DR
    assert r["clip_factors"]["1.5"]["estimate"] == pytest.approx(rows["cql_served", "step_dr_clip"]["estimate"])
    assert r["clip_factors"]["inf"]["estimate"] == pytest.approx(rows["cql_served", "step_dr"]["estimate"])
    assert set(res["summary"]["clip_factors"]) == {"1.5", "inf"}


@pytest.mark.slow
def test_offline_quality_on_exploring_sage_logs_values_what_the_logs_support(tmp_path):
    """The --exploring-sage mode end to end: with the exploring checkpoint's logs every candidate
    gets a number; with SAGE's deterministic YAML logs (rate 0) a candidate that deviates gets none."""
    for rate, name in (("0.2", "explore.json"), ("0", "yaml.json")):
        run("benchmarks/offline_quality.py", "--exploring-sage", "--seeds", "1", "--workers", "1", "--episodes",
            "1500", "--exploration-rate", rate, "--out", str(tmp_path / name))
    explore = json.loads((tmp_path / "explore.json").read_text())["summary"]
    yaml_only = json.loads((tmp_path / "yaml.json").read_text())["summary"]
    assert explore["served_best_binary"]["no_support"] == 0 and explore["served_best_binary"]["step_dr"]["evaluated"]
    assert yaml_only["served_best_binary"]["no_support"] == 1 and yaml_only["served_best_binary"]["step_dr"] is None
    assert yaml_only["yaml_table"]["step_dr"]["evaluated"] == 1  # the table itself is what its logs support


@pytest.mark.slow
@pytest.mark.parametrize("script, flag", [("ppo_vs_sb3.py", "--seeds"), ("closed_loop.py", "--seeds"),
                                          ("closed_loop.py", "--workers"), ("offline_quality.py", "--workers")])
def test_a_count_below_one_is_a_usage_error_naming_the_flag(script, flag):
    out = subprocess.run([sys.executable, f"benchmarks/{script}", flag, "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and f"argument {flag}: expected a whole number >= 1, got 0" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, says", [
    ("--change-z", "-1", "--change-z (the loop's change.z): Input should be greater than 0, got -1.0"),
    ("--epsilon-max", "3", "--epsilon-max (the loop's exploration.epsilon_max): Input should be less than or equal "
                           "to 1, got 3.0"),
    ("--alphas", "-1", "--alphas (the loop's alphas): Input should be greater than or equal to 0, got -1.0"),
])
def test_closed_loop_refuses_a_bad_flag_before_any_month_naming_it(tmp_path, flag, value, says):
    out = subprocess.run([sys.executable, "benchmarks/closed_loop.py", "--seeds", "1", flag, value,
                          "--out", str(tmp_path / "cl.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "cl.json").exists()


@pytest.mark.slow
def test_closed_loop_runs_a_tiny_month(tmp_path):
    out = tmp_path / "cl.json"
    run("benchmarks/closed_loop.py", "--seeds", "1", "--days", "3", "--episodes-per-day", "300", "--cql-steps", "30",
        "--workers", "1", "--worlds", "stationary", "--out", str(out))
    res = json.loads(out.read_text())
    s = res["summary"]["stationary"]
    assert s["seeds"] == 1 and s["promotions"] + s["rejected_online"] == s["offline_gate_passed"]
    assert (tmp_path / "closed_loop_stationary.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_loop_calibration_maps_one_combination(tmp_path):
    out = tmp_path / "lc.json"
    printed = run("benchmarks/loop_calibration.py", "--synthetic", "--seconds", "70", "--latency-weights", "0.01",
                  "--cost-weights", "20", "--tests-gains", "10", "--out", str(out)).stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert row["table_fallback_fits"] and 0 < row["static_pass"] <= row["oracle_pass"] <= 1
    # learned from the task's observation, a class cannot beat its per-task optimum
    assert row["learned one-step route"] <= row["best one-step route"] + 1e-9
    # the knobs not given keep the file's values: 4 calls, slope 6, timeout gain -2.5
    assert "| 70 | 4 | 0.01 | 20 | 10 | 6 | -2.5 | yes |" in printed
    assert (row["calls"], row["difficulty_slope"], row["timeout_gain"]) == (4, 6.0, -2.5)


@pytest.mark.slow
def test_loop_calibration_samples_every_knob_within_its_range(tmp_path):
    out = tmp_path / "lc.json"
    printed = run("benchmarks/loop_calibration.py", "--synthetic", "--sample", "3", "--sample-seed", "1",
                  "--out", str(out)).stdout
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and len({r["cost_weight"] for r in rows}) == 3
    ranges = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, loop_calibration as lc; print(json.dumps(lc.SAMPLE_RANGES))"],
        cwd=ROOT / "benchmarks", capture_output=True, text=True, check=True, timeout=60).stdout)
    assert set(ranges) == {"seconds", "calls", "latency_weight", "cost_weight", "tests_gain", "difficulty_slope",
                           "timeout_gain"}
    for r in rows:
        for knob, (lo, hi) in ranges.items():
            assert lo <= r[knob] <= hi, (knob, r[knob])
        assert isinstance(r["calls"], int)
    assert "all three goals met with the best one-step route per task in" in printed


def test_loop_calibration_refuses_grid_flags_beside_sample(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/loop_calibration.py", "--sample", "3", "--seconds", "70",
                          "--out", str(tmp_path / "lc.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--sample draws every knob from SAMPLE_RANGES: drop --seconds" in out.stderr
    assert not (tmp_path / "lc.json").exists()


@pytest.mark.slow
def test_loop_calibration_refuses_a_bad_budget_naming_the_field(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/loop_calibration.py", "--synthetic", "--seconds", "-5",
                          "--latency-weights", "0.01", "--cost-weights", "20", "--tests-gains", "10",
                          "--out", str(tmp_path / "lc.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "seconds -5" in out.stderr and "Budget\nseconds" in out.stderr
    assert not (tmp_path / "lc.json").exists()
