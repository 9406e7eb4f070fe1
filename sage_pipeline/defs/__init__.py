"""The Dagster layer: thin assets, checks, jobs and resources over the pure core."""

import dagster as dg

from sage_pipeline import artifacts


def _running_asset() -> str | None:
    """The asset (and partition) of the Dagster step running now, for ``artifacts``' errors: a
    failed write names it (``artifacts.ArtifactWriteError``). None outside a step."""
    try:
        ctx = dg.OpExecutionContext.get()
    except dg.DagsterInvariantViolationError:
        return None
    keys = sorted(k.to_user_string() for k in ctx.selected_asset_keys) or [ctx.op_handle.name]
    name = ", ".join(keys)
    return f"{name} (partition {ctx.partition_key})" if ctx.has_partition_key else name


artifacts.set_writer_resolver(_running_asset)
