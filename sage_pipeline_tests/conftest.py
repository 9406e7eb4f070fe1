"""Shared fixtures: the project's example multi-model catalogue, routing table and simulator (the tests of
the routing simulator, the learners and OPE need many models; the sage resource's default is SAGE's own table,
``sage_pipeline.sage.table.SAGE_TABLE``, with ``routing.catalogue.SAGE_CATALOGUE``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from sage_pipeline.routing.catalogue import DEFAULT_CATALOGUE, ModelCatalogue  # noqa: E402
from sage_pipeline.routing.routing_simulator import RoutingSimulator  # noqa: E402
from sage_pipeline.sage.table import DEFAULT_TABLE, RoutingTable  # noqa: E402
from sage_pipeline_tests.sage_contract.sage_journals import SAGE_SKIP, require_sage, write_journals  # noqa: E402


@pytest.fixture(scope="session")
def catalogue() -> ModelCatalogue:
    return ModelCatalogue.load(DEFAULT_CATALOGUE)


@pytest.fixture(scope="session")
def table(catalogue) -> RoutingTable:
    return RoutingTable.load(DEFAULT_TABLE)


@pytest.fixture(scope="session")
def sim(catalogue, table) -> RoutingSimulator:
    return RoutingSimulator(catalogue, table)


# The fast lane (`make test-fast`: -m "not docker and not browser and not postgres and not slow")
# leaves out the tests that need a system service and the ones that take seconds. They are marked
# here, by the fixture they use or by name, so a test file needs no marker of its own; `make test`
# and CI run everything.
_FIXTURE_MARKS = {
    "docker_ready": "docker",  # the Docker daemon and the sage-sim image (docker_sandbox, suite_sandbox use it)
    "sage_python": "sage_contract",  # SAGE's own code, in its own virtualenv (SAGE_PYTHON)
    "chrome_binaries": "browser",  # Chromium + chromedriver
}
# "module" (all of it), "module::test" (every parametrization) or "module::test[id]" -> markers
_NAMED_MARKS: dict[str, tuple[str, ...]] = {
    "sim/test_sandbox.py::test_verdicts[docker_sandbox]": ("docker",),
    "sim/test_sandbox.py::test_the_test_suite_never_leaves_containers_behind": ("docker",),  # runs `docker ps`
    "ui/test_postgres_storage.py": ("postgres",),  # a throwaway PostgreSQL cluster
    "routing/test_sage_generated_journals.py": ("sage_contract",),  # SAGE's own code writes the journals
    "defs/test_routing_assets.py::test_journals_sage_wrote_pass_the_blocking_checks": ("sage_contract",),
    # PostgreSQL storage and a Redis broker
    "cluster/test_celery_executor.py::test_slice_runs_on_two_celery_workers_with_in_process_results": ("postgres",),
}
# slow: modules that train models or materialize Dagster assets, then single tests that took 0.6 s
# or more (setup included) in a run of everything else (2026-11-24, 2 cores at load ~4.5)
_SLOW = (
    "defs/test_benchmark_assets.py",
    "defs/test_online_ab.py",
    "defs/test_offline_eval_sessions.py",
    "defs/test_policy_iteration_asset.py",
    "defs/test_routing_assets.py",
    "defs/test_run_reaper.py",
    "defs/test_sage_journal_chain.py",
    "defs/test_sim_assets.py",
    "rl/test_bandit.py",
    "rl/test_bc.py",
    "rl/test_cql.py",
    "rl/test_offline_eval.py",
    "rl/test_online_ab.py",
    "rl/test_policy_iteration.py",
    "rl/test_ppo.py",
    "test_artifact_sets.py",
    "test_materialize_all.py::test_a_step_in_process_is_a_dagster_run_and_a_failed_step_is_named",
    "test_readme_path.py",  # the README's path to a deployed bundle, run as written
    "test_readme_commands.py::test_make_test_fast_selects_tests_and_leaves_out_the_slow_ones",  # a pytest collection
    "test_fault_injection.py",
    "ui/test_run_summary.py",
    "defs/test_run_monitoring.py::test_shipped_instance_enables_run_monitoring",
    "sage_world/test_model_world.py::test_best_expressible_is_never_below_yaml_or_any_fixed_choice",
    "sage_world/test_model_world.py::test_the_test_file_passes_the_reference_and_fails_every_wrong_candidate",
    "sage_world/test_model_world.py::test_exact_value_matches_drawn_runs",
    "sage_world/test_bundle_truth.py",  # builds a model world (6 s) and searches bundles exactly
    "sage_world/test_model_world.py::test_the_coder_is_right_with_the_calibrated_chance",
    "defs/test_sim_policy_assets.py::test_a_tasks_file_from_another_version_fails_with_a_clear_error",
    "rl/test_ope.py::test_bandit_ips_and_dr_are_unbiased_and_their_intervals_cover_the_truth",
    "rl/test_ope.py::test_episode_estimators_recover_the_exact_policy_value",
    "rl/test_ope.py::test_evaluate_policy_on_the_routing_dataset",
    "rl/test_router.py::test_logged_propensity_is_the_exact_frequency_with_exploration",
    "sage/test_explore.py::test_sages_router_explores_with_the_reconstructed_probability",
    "sage/test_explore.py::test_exploration_cost_against_the_simulators_truth",
    "sage/test_explore.py::test_sages_router_runs_every_checkpoint_kind_as_the_project_models_it",
    "sage/test_checkpoint.py::test_sage_loads_the_file_unchanged_in_a_bare_process",
    "routing_benchmark/test_recommend.py::test_metadata_and_text_recommend_a_router_that_beats_the_lookup_and_zero",
    "routing_benchmark/test_recommend.py::test_selection_never_reads_the_test_prompts",
    "routing_benchmark/test_recommend.py::test_only_eval_name_tells_then_the_lookup_family_is_recommended",
    "routing_benchmark/test_recommend.py::test_nothing_to_learn_falls_back_to_the_zero_routers_hull",
    "routing_benchmark/test_recommend.py::test_bc_and_cql_are_shown_for_ope_only",
    "routing_benchmark/test_recommend.py::test_recommended_router_is_served_and_survives_a_reload",
    "routing_benchmark/test_recommend.py::test_a_table_shaped_like_the_published_ones",
    "routing_benchmark/test_recommend.py::test_recommend_config_errors",
    "routing_benchmark/test_run.py::test_given_split_from_a_split_column_and_its_errors",
    "routing_benchmark/test_run.py::test_many_models_in_routerbench_layout",
    "routing_benchmark/test_run.py::test_precomputed_embeddings_as_features",
    "routing_benchmark/test_run.py::test_two_model_run_has_every_baseline_router_and_metric",
    "routing/test_collector.py::test_a_killed_run_leaves_the_old_set_or_the_new_one_and_the_next_run_sweeps_it",
    "routing/test_collector.py::test_ingest_of_sessions_reads_exactly_the_current_set_after_several_runs",
    "routing/test_collector.py::test_two_concurrent_runs_both_succeed_and_the_last_switch_wins",
    "routing/test_expectations.py::test_clean_dataset_passes_the_contract",
    "routing/test_expectations.py::test_missing_column_fails_naming_it",
    "routing/test_expectations.py::test_the_file_contract_in_batches_agrees_with_the_whole_frame",
    "routing/test_expectations.py::test_the_file_contract_on_an_empty_file_and_a_missing_column",
    "routing/test_ingest.py::test_corrupt_gzip_keeps_each_line_decoded_before_the_damage",
    "routing/test_routing_dataset.py::test_a_build_in_session_chunks_writes_the_same_files",
    "routing/test_routing_simulator.py::test_oracle_matches_simulation",
    "routing/test_routing_simulator.py::test_values_in_chunks_equal_one_backward_pass",
    "sim/test_setup_docker.py::test_a_client_without_dockerd_installs_docker_io_and_starts_the_daemon",
    "sim/test_setup_docker.py::test_a_daemon_that_never_answers_fails_within_the_wait_and_shows_its_log",
    "sim/test_tasks.py::test_a_reference_timeout_is_run_again_before_the_task_is_dropped",
    "sleep/test_backends.py::test_a_server_that_never_finishes_its_headers_hits_the_deadline",
    "sleep/test_backends.py::test_a_server_trickling_its_body_hits_the_deadline",
    "sleep/test_backends.py::test_each_retry_gets_its_own_deadline_and_the_call_stays_bounded",
    "sleep/test_backends.py::test_the_deadline_holds_over_https_too",
    "sleep/test_nightly.py::test_nights_learn_only_helpful_rules_and_leave_the_rest_alone",
    "sleep/test_store_harvest.py::test_a_commit_killed_between_the_live_documents_is_finished_by_the_next_run",
    "sleep/test_store_harvest.py::test_a_version_read_while_its_folder_is_re_saved_is_whole_and_never_an_error",
    "sleep/test_store_harvest.py::test_two_nights_of_one_skill_never_overlap",
    "sleep/test_sage_skills.py::test_readers_during_commits_always_see_one_whole_version",
    "sleep/test_sage_skills.py::test_a_bundle_of_the_live_version_deploys_sage_skills_root_with_the_stores_shas",
    "sage_world/test_phase5.py::test_a_tool_past_its_limit_is_killed_and_recorded",
    "sage_world/test_phase5.py::test_a_tool_exiting_non_zero_is_recorded_with_its_cause_and_the_others_go_on",
    "sage_world/test_phase5.py::test_eval_output_without_sages_fields_and_a_missing_checkpoint_are_failures",
    "sage_world/test_skills_world.py",
    "test_artifacts_concurrency.py::test_a_reader_never_fails_nor_mixes_versions_while_the_checkpoint_is_re_saved",
    "test_artifacts_concurrency.py::test_concurrent_saves_of_one_folder_all_succeed_and_leave_one_complete_version",
)
_NAMED_MARKS.update({key: (*_NAMED_MARKS.get(key, ()), "slow") for key in _SLOW})
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    modules = {}
    for item in items:
        path = Path(str(item.fspath)).relative_to(_HERE).as_posix()
        modules.setdefault(path, item.module)
        for fixture, marker in _FIXTURE_MARKS.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
        for key in {path, f"{path}::{item.originalname}", f"{path}::{item.name}"}:
            for marker in _NAMED_MARKS.get(key, ()):
                item.add_marker(marker)
    # a renamed test must not drop out of its marker silently (and so into the fast lane)
    stale = [key for key in _NAMED_MARKS if "::" in key and key.split("::")[0] in modules
             and not hasattr(modules[key.split("::")[0]], key.split("::")[1].split("[")[0])]
    if stale:
        raise pytest.UsageError(f"sage_pipeline_tests/conftest.py marks tests that no longer exist: {stale}")


# ----------------------------------------------------------------- SAGE's own code (the contract)
@pytest.fixture(scope="session")
def sage_python() -> str:
    """A Python that runs SAGE's code (``SAGE_PYTHON``; skipped or failed by the rule in
    sage_contract/sage_journals.py)."""
    return require_sage()[0]


@pytest.fixture(scope="session")
def sage_journals(sage_python, tmp_path_factory):
    """``write(**options) -> (sessions folder, summary)``: journals written by SAGE's own
    functions; options are the writer's flags (``days=3, sessions_per_day=2, no_session_id=True``)."""
    def write(**options) -> tuple[Path, dict]:
        ws = tmp_path_factory.mktemp("sage_ws")
        return ws / "memory" / "sessions", write_journals(ws, **options)
    return write


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if SAGE_SKIP in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(f"SAGE contract: {len(skipped)} tests did not run, SAGE_SRC/SAGE_PYTHON unset "
                                    "(make test SAGE_SRC=<a SAGE checkout> runs them)", yellow=True)
