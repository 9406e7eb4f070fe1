"""The reward report on a small synthetic routing dataset built by the real pipeline core."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sage_pipeline import markdown
from sage_pipeline.routing import reward_report as rr
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.collector import CollectorConfig, collect
from sage_pipeline.routing.ingest import IngestConfig, ingest
from sage_pipeline.routing.routing_dataset import build_routing_dataset, read_routing_dataset, write_routing_dataset
from sage_pipeline.routing.routing_simulator import RoutingSimulator
from sage_pipeline.sage.table import RoutingTable


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    tmp = tmp_path_factory.mktemp("reward_report")
    cat = ModelCatalogue.load()
    tab = RoutingTable.load()
    collect(RoutingSimulator(cat, tab), tmp / "sessions", CollectorConfig(episodes=800, seed=1))
    res = ingest(IngestConfig((tmp / "sessions",)), tmp / "routing")
    return build_routing_dataset(pq.read_table(res.trajectories).to_pandas(), tab, cat).frame


@pytest.fixture(scope="module")
def report(dataset: pd.DataFrame) -> dict:
    return rr.compute_reward_report(dataset)


def tiny(scores: list[float]) -> pd.DataFrame:
    """A hand-made dataset with one decision per complexity score."""
    n = len(scores)
    return pd.DataFrame({
        "episode_id": [f"s/t{i}" for i in range(n)], "session_id": "s", "role": "coder", "model": "gpt-4.1",
        "action_kind": "primary", "fallback_triggered": False, "reward": np.linspace(-1.0, 1.0, n),
        "reward_version": "reward_v1",
        "verification_passed": pd.array([True] * n, dtype="boolean"), "timed_out": False,
        "task_complexity_score": scores, "cost_usd": 0.01, "propensity_source": "logged",
        "split": "train", "data_source": "synthetic",
    })


def test_counts_add_up(dataset: pd.DataFrame, report: dict) -> None:
    o, n = report["overall"], len(dataset)
    assert o["rows"] == n
    assert o["episodes"] == dataset["episode_id"].nunique()
    assert o["sessions"] == dataset["session_id"].nunique()
    for key in ("by_role", "by_model", "by_action_kind"):
        assert sum(g["count"] for g in report[key].values()) == n, key
    assert sum(g["count"] for models in report["by_role_model"].values() for g in models.values()) == n
    assert sum(o["rows_by_split"].values()) == n == sum(o["rows_by_data_source"].values())
    assert set(report["by_role"]) == set(dataset["role"]) and set(report["by_model"]) == set(dataset["model"])
    kinds = report["by_action_kind"]
    assert o["fallback_rate"] == pytest.approx(dataset["fallback_triggered"].mean())
    assert kinds["fallback"]["count"] <= dataset["fallback_triggered"].sum()
    assert o["explore_share"] == pytest.approx(kinds["explore"]["count"] / n)
    assert o["reward_versions"] == ["reward_v1"] and o["logged_propensity_share"] == 1.0


def test_group_figures_match_pandas(dataset: pd.DataFrame, report: dict) -> None:
    coder = dataset[dataset["role"] == "coder"]
    got = report["by_role"]["coder"]
    assert got["count"] == len(coder)
    assert got["mean"] == pytest.approx(coder["reward"].mean())
    assert got["std"] == pytest.approx(coder["reward"].std())
    assert got["p5"] == pytest.approx(coder["reward"].quantile(0.05))
    assert got["p95"] == pytest.approx(coder["reward"].quantile(0.95))
    assert got["timeout_rate"] == pytest.approx(coder["timed_out"].mean())
    assert got["fallback_rate"] == pytest.approx(coder["fallback_triggered"].mean())
    assert got["mean_cost_usd"] == pytest.approx(coder["cost_usd"].mean())
    assert got["success_rate"] == pytest.approx(coder["verification_passed"].astype(float).mean())

    cell = dataset[(dataset["role"] == "coder") & (dataset["model"] == "claude-sonnet-4")]
    got = report["by_role_model"]["coder"]["claude-sonnet-4"]
    assert got["count"] == len(cell) and got["p50"] == pytest.approx(cell["reward"].median())
    assert report["overall"]["mean"] == pytest.approx(dataset["reward"].mean())


def test_success_rate_ignores_unknown_verification(dataset: pd.DataFrame) -> None:
    df = dataset.copy()
    unknown = (df["role"] == "reviewer") | (np.arange(len(df)) % 3 == 0)
    df.loc[unknown, "verification_passed"] = pd.NA
    rep = rr.compute_reward_report(df)
    known = dataset.loc[~unknown, "verification_passed"].astype(float)
    assert rep["overall"]["verification_known"] == len(known) < len(df)
    assert rep["overall"]["success_rate"] == pytest.approx(known.mean())
    assert rep["by_role"]["reviewer"]["success_rate"] is None
    assert rep["by_role"]["reviewer"]["verification_known"] == 0
    # the same column as plain objects (True/False/None), as read back from JSON lines
    as_objects = df.assign(verification_passed=df["verification_passed"].astype(object))
    assert rr.compute_reward_report(as_objects)["overall"] == rep["overall"]


def test_complexity_bins_cover_all_rows(dataset: pd.DataFrame, report: dict) -> None:
    rvc = report["reward_vs_complexity"]
    assert len(rvc["bins"]) == rr.COMPLEXITY_BINS and rvc["edges"][0] == 0.0 and rvc["edges"][-1] == 1.0
    for key in ("by_role", "by_model"):
        for name, s in rvc[key].items():
            assert len(s["count"]) == len(s["mean"]) == rr.COMPLEXITY_BINS
            assert sum(s["count"]) == report[key][name]["count"]
            assert all((c == 0) == (m is None) for c, m in zip(s["count"], s["mean"]))
    in_bin = dataset[(dataset["model"] == "gpt-4.1") & (dataset["task_complexity_score"] >= 0.4)
                     & (dataset["task_complexity_score"] < 0.6)]
    assert rvc["by_model"]["gpt-4.1"]["count"][2] == len(in_bin)
    assert rvc["by_model"]["gpt-4.1"]["mean"][2] == pytest.approx(in_bin["reward"].mean())


def test_bin_edges_and_empty_bins() -> None:
    rep = rr.compute_reward_report(tiny([0.0, 0.1999, 0.2, 1.0]))
    s = rep["reward_vs_complexity"]["by_role"]["coder"]
    assert s["count"] == [2, 1, 0, 0, 1]  # 1.0 falls in the closed last bin
    assert s["mean"][2] is None and s["mean"][4] == pytest.approx(1.0)
    assert rep["reward_vs_complexity"]["bins"][-1] == "[0.8, 1.0]"


def test_report_is_strict_json(report: dict) -> None:
    assert json.loads(json.dumps(report, allow_nan=False)) == report
    single = rr.compute_reward_report(tiny([0.5]))  # std of one row is undefined -> None
    assert single["overall"]["std"] is None
    json.dumps(single, allow_nan=False)


def test_report_from_parquet_or_any_index_matches(dataset: pd.DataFrame, report: dict,
                                                  tmp_path: Path) -> None:
    files = write_routing_dataset(dataset, tmp_path)
    assert rr.compute_reward_report(read_routing_dataset(files.parquet)) == report
    assert rr.compute_reward_report(dataset.set_axis(dataset.index * 7 + 3)) == report


def test_markdown(dataset: pd.DataFrame, report: dict) -> None:
    md = rr.report_markdown(report)
    assert "### Overall" in md and "### By role" in md and "### By model" in md
    for name in set(dataset["role"]) | set(dataset["model"]):
        assert f"`{name}`" in md
    assert f"{100 * report['overall']['timeout_rate']:.1f}%" in md
    assert "estimates them" not in md and "mixes reward versions" not in md


def test_markdown_flags_missing_propensities_and_mixed_versions(dataset: pd.DataFrame) -> None:
    df = dataset.assign(propensity_source="missing")
    df.loc[df.index[:10], "reward_version"] = "reward_v2"
    md = rr.report_markdown(rr.compute_reward_report(df))
    assert "estimates them (BC)" in md and "mixes reward versions" in md


def test_plots_are_png(dataset: pd.DataFrame, report: dict) -> None:
    for png in (rr.plot_reward_by_role(dataset), rr.plot_reward_vs_complexity(report)):
        assert png.startswith(b"\x89PNG") and len(png) < 200_000
    md = markdown.image(b"\x89PNGxyz", "reward by role")
    assert md.startswith("![reward by role](data:image/png;base64,") and md.endswith(")")
    assert base64.b64decode(md.split(",", 1)[1][:-1]) == b"\x89PNGxyz"


def test_write_reward_report(report: dict, tmp_path: Path) -> None:
    pngs = {"reward_by_role": b"\x89PNG1", "reward_vs_complexity": b"\x89PNG2"}
    paths = rr.write_reward_report(report, pngs, tmp_path / "reports")
    assert paths["reward_report"] == tmp_path / "reports" / "reward_report.json"
    assert json.loads(paths["reward_report"].read_text()) == report
    assert paths["reward_by_role"].name == "reward_by_role.png"
    assert paths["reward_vs_complexity"].read_bytes() == b"\x89PNG2"
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        "reward_by_role.png", "reward_report.json", "reward_vs_complexity.png"]  # no temp files left
    with pytest.raises(ValueError, match="plain file names"):
        rr.write_reward_report(report, {"../escape": b""}, tmp_path)


def test_bad_input_names_the_problem(dataset: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match=r"verification_passed.*materialize routing_dataset"):
        rr.compute_reward_report(dataset.drop(columns=["verification_passed"]))
    with pytest.raises(ValueError, match="no rows.*materialize routing_dataset"):
        rr.compute_reward_report(dataset.iloc[:0])
    with pytest.raises(ValueError, match="reward"):
        rr.plot_reward_by_role(dataset.drop(columns=["reward"]))


def test_module_imports_neither_dagster_nor_matplotlib() -> None:
    code = ("import sys, sage_pipeline.routing.reward_report; "
            "bad = [m for m in ('dagster', 'matplotlib') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
