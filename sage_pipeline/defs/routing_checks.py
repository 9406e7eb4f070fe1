"""Great Expectations suites on routing_dataset, as Dagster asset checks."""


import json

import dagster as dg

from sage_pipeline.defs.resources import SageResource
from sage_pipeline.routing import expectations, routing_dataset as rd
from sage_pipeline.routing.action_space import FILE_NAME as ACTION_SPACE_FILE, ActionSpace


@dg.asset_check(asset="routing_dataset", blocking=True,
                description="Great Expectations contract: required columns and types, ranges "
                            "(complexity in [0,1], finite rewards in [-2,2], propensity in (0,1]), "
                            "allowed models per role, unique decision ids. Blocks downstream assets.")
def routing_dataset_contract(sage: SageResource) -> dg.AssetCheckResult:
    res = expectations.validate_contract_file(sage.path("routing", rd.PARQUET_NAME),
                                              ActionSpace.load(sage.path("routing", ACTION_SPACE_FILE)))
    return dg.AssetCheckResult(
        passed=res.success,
        metadata={"expectations": len(res.outcomes), "failed": len(res.failures()),
                  "validated": f"every row, in batches of {expectations.BATCH_ROWS:,} (decision_id whole)",
                  "result": dg.MetadataValue.md(res.to_markdown())})


@dg.asset_check(asset="routing_dataset", blocking=False,
                description="Great Expectations volume: at least min_rows_per_role decisions (default "
                            "500) for every role that has decisions in the dataset. A role with none is not "
                            "judged (SAGE's `sage run` never logs shell_router or shell_chat, and its planner "
                            "and reviewer decisions have no outcome of their own): it is listed with why. A "
                            "warning: few rows make per-role estimates noisy.")
def routing_dataset_volume(sage: SageResource) -> dg.AssetCheckResult:
    df = rd.read_routing_dataset(sage.path("routing", rd.PARQUET_NAME), ["role"])  # all the suite reads
    roles = ActionSpace.load(sage.path("routing", ACTION_SPACE_FILE)).roles
    report = sage.path("routing", rd.BUILD_REPORT_NAME)
    built = json.loads(report.read_text()) if report.is_file() else {}
    judged, without = expectations.roles_to_judge(df, roles, built)
    res = expectations.validate_volume(df, judged, sage.min_rows_per_role)
    return dg.AssetCheckResult(
        passed=res.success, severity=dg.AssetCheckSeverity.WARN,
        metadata={"min_rows_per_role": sage.min_rows_per_role, "roles_judged": list(judged),
                  "roles_without_rows": dg.MetadataValue.json(without),
                  "result": dg.MetadataValue.md(res.to_markdown())})
