"""In-process materialization of the routing_benchmark asset on a small slice of RouteLLM's MMLU table."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.definitions import defs
from sage_pipeline.defs.benchmark_assets import CHECK, GROUP, JOB, routing_benchmark
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.routing_benchmark.routers import load_bundle

SLICE = Path(__file__).parents[1] / "routing_benchmark" / "fixtures" / "routellm_mmlu_slice"
FAST = {"table": {"path": str(SLICE)}, "tfidf_svd": {"n_components": 32}, "bc": {"steps": 80}, "cql": {"steps": 80},
        "ope": {"n_boot": 30}, "aiq_boot": 30}


def _materialize(root: Path, config: dict, raise_on_error: bool = True):
    return dg.materialize([routing_benchmark], resources={"sage": SageResource(data_dir=str(root))},
                          run_config={"ops": {"routing_benchmark": {"config": config}}},
                          raise_on_error=raise_on_error)


@pytest.fixture(scope="module")
def materialized(tmp_path_factory):
    root = tmp_path_factory.mktemp("sage")
    return root, _materialize(root, FAST)


def test_asset_writes_report_routers_and_readable_metadata(materialized):
    root, result = materialized
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("routing_benchmark")[0].metadata.items()}
    assert meta["dagster/row_count"] == 359  # 6 files x 60 rows, one listed as contaminated
    assert meta["excluded_prompts"] == 1 and meta["dropped_rows"] == 0 and meta["dropped_files"] == 0
    assert meta["dropped_index_columns"] == [] and meta["quality_scale"] == {"routellm": "binary (0 or 1)"}
    assert meta["train_prompts"] + meta["test_prompts"] == 359
    for key in ("results", "selection", "per_eval", "routellm", "ope", "costs", "dropped"):
        assert isinstance(meta[key], str) and meta[key].startswith(("**", "APGR", "Logged", "Where", "360", "How",
                                                                    "AIQ per")), key
    assert meta["recommended_router"] in meta["selection"] and "RouterBench's headline" in meta["per_eval"]
    assert "zero_router" in meta["results"] and "oracle" in meta["results"]
    assert "price_table_default_output" in meta["costs"]
    assert "data:image/png;base64," in meta["plot"]
    report = json.loads((root / "reports" / "routing_benchmark.json").read_text())
    assert report["n_test"] == meta["test_prompts"]
    assert {r["router"] for r in report["results"]} >= {"zero_router", "random", "oracle", "regression", "bc", "cql"}
    assert report["aiq_cost_range"][0] < report["aiq_cost_range"][1]
    assert (root / "reports" / "routing_benchmark.png").stat().st_size > 1000
    bundle = load_bundle(root / "checkpoints" / GROUP)
    assert bundle.route(["What is 2 + 2?\nA. 3\nB. 4\nAnswer:"], cost_weight=0.0)[0] in bundle.models


def test_check_reports_against_the_random_router_with_an_interval(materialized):
    _, result = materialized
    evals = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert [e.check_name for e in evals] == [CHECK]
    e = evals[0]
    assert e.severity == dg.AssetCheckSeverity.WARN
    md = {k: v.value for k, v in e.metadata.items()}
    assert md["margin_vs_random_ci95_low"] <= md["margin_vs_random_ci95_high"]
    assert e.passed == (md["margin_vs_random_ci95_low"] > 0)  # the recommended router, not the best on test
    assert md["recommended_router"] and md["margin_vs_eval_lookup_ci95_low"] is not None


def test_a_failed_report_write_leaves_the_previous_set_whole(materialized, monkeypatch):
    """Issue 35: the checkpoint, PNG and JSON switch together; a write that fails mid-set (a full disk at
    the JSON) leaves the previous run's three, not a mixed set."""
    import shutil

    from sage_pipeline import artifacts

    root, _ = materialized
    copy = root.parent / "mixed"
    shutil.copytree(root, copy, symlinks=True)
    files = [copy / "reports" / "routing_benchmark.json", copy / "reports" / "routing_benchmark.png",
             copy / "checkpoints" / GROUP / "router.json"]
    before = [f.read_bytes() for f in files]
    real = artifacts.write_json

    def full_disk(dest, obj):
        if str(dest).endswith("routing_benchmark.json"):
            raise OSError(28, "No space left on device", str(dest))
        return real(dest, obj)

    monkeypatch.setattr(artifacts, "write_json", full_disk)
    res = _materialize(copy, FAST | {"seed": 7}, raise_on_error=False)
    assert not res.success
    assert [f.read_bytes() for f in files] == before


def test_bad_path_fails_with_the_path_in_the_error(tmp_path):
    with pytest.raises(Exception, match="no such file or folder") as info:
        _materialize(tmp_path, FAST | {"table": {"path": str(tmp_path / "nope")}})
    assert "nope" in str(info.value)


def test_the_run_config_is_the_cores_section_by_section(tmp_path):
    """The asset's config is BenchmarkConfig: left out, every section has the core's defaults (the
    benchmark's small bandit critics included); paths resolve against the artifact root."""
    from sage_pipeline.defs.benchmark_assets import RoutingBenchmarkConfig
    from sage_pipeline.defs.sections import to_core
    from sage_pipeline.routing_benchmark import run as brun

    default = to_core(RoutingBenchmarkConfig(), brun.BenchmarkConfig)
    assert default.model_dump() == brun.BenchmarkConfig().model_dump()
    assert (default.cql.mode, default.cql.hidden, default.cql.steps) == ("bandit", [16], 600)
    cfg = to_core(RoutingBenchmarkConfig(table={"path": "t.csv", "price_table": None}, split="given",
                                         test_path="te", cql={"alpha": 0.1}), brun.BenchmarkConfig).under(tmp_path)
    assert (cfg.table.path, cfg.test_path, cfg.table.price_table) == (str(tmp_path / "t.csv"), str(tmp_path / "te"),
                                                                      None)
    assert (cfg.cql.alpha, cfg.cql.mode, cfg.cql.steps) == (0.1, "bandit", 600)
    with pytest.raises(Exception, match=r"table\.layout|layout"):
        RoutingBenchmarkConfig(table={"layout": "wide"})
    with pytest.raises(dg.DagsterInvalidConfigError, match='unexpected config entry "n_boot"'):
        _materialize(tmp_path, {"n_boot": 30})  # a flat key of the old config is refused, not ignored


def test_registered_in_the_definitions_with_its_job():
    dg.Definitions.validate_loadable(defs)  # e.g. a job named like an asset is refused here
    key = dg.AssetKey("routing_benchmark")
    assert key in defs.resolve_asset_graph().get_all_asset_keys()
    assert defs.resolve_job_def(JOB).asset_layer.executable_asset_keys == {key}


def test_a_recommended_zero_router_ties_random_and_the_check_says_so(tmp_path):
    """Issue 43: outcomes that nothing predicts, so the zero router's hull is recommended. The random router's AIQ
    is its expectation, that same hull: the check warns that nothing learned beats random, and says the zero
    router ties it, never that it loses to it."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    prompts = [" ".join(rng.choice(words, 6)) + f" #{i}" for i in range(480)]
    pd.DataFrame({"prompt": prompts, "mistralai/Mixtral-8x7B-Instruct-v0.1": rng.random(480) < 0.6,
                  "gpt-4-1106-preview": rng.random(480) < 0.75}).to_csv(tmp_path / "noise.csv")
    res = _materialize(tmp_path, FAST | {"table": {"path": str(tmp_path / "noise.csv")}})
    meta = {k: v.value for k, v in res.asset_materializations_for_node("routing_benchmark")[0].metadata.items()}
    assert meta["recommended_router"] == "zero_router"
    assert meta["random_router_aiq"] == pytest.approx(meta["zero_router_aiq"], abs=1e-12)
    check = [e.event_specific_data for e in res.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"][0]
    md = {k: v.value for k, v in check.metadata.items()}
    assert not check.passed and md["margin_vs_random_ci95_low"] >= -1e-12
    assert "ties the random router" in check.description and "ties the random router" in md["verdict"]
    for text in (check.description, meta["results"]):
        assert "does NOT beat" not in text and "below the random" not in text
    assert " [" in meta["per_eval"] and meta["aiq_mean_over_eval_name_ci95"]["zero_router"]
