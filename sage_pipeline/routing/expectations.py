"""Great Expectations suites for the routing dataset: a blocking contract and a volume warning.

``contract`` is what every consumer of ``routing_v1.parquet`` relies on: the documented
columns exist with the right types, values lie in their ranges (NaN and inf rewards fail),
every (role, model) pair is one the dataset's action space allows (roles from the routing
table, models from the table and the logs), and decision ids are unique.
``volume`` warns when a role has too few rows to learn from; a role absent from the data
is reported with 0 rows. Both run on an ephemeral GX context (no files, no network, no
progress bars). GX is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sage_pipeline.routing.schema import DATA_SOURCES, DATASET_COLUMNS, REWARD_MAX, REWARD_MIN, SPLITS

if TYPE_CHECKING:
    import pandas as pd

    from sage_pipeline.routing.action_space import ActionSpace

INTEGER_TYPES = ["int64", "int32", "Int64Dtype", "Int32Dtype"]  # numpy dtypes and pandas nullable ones
NUMERIC_TYPES = ["float64", "float32", "Float64Dtype", "Float32Dtype", *INTEGER_TYPES]
NUMERIC_COLUMNS = ("reward", "logged_reward", "propensity", "task_complexity_score", "cost_usd")
INTEGER_COLUMNS = ("step", "primary_failure_count", "failure_count", "action_index", "schema_version")
STRING_COLUMNS = ("decision_id", "role", "model", "split", "data_source", "reward_version")
# cost_usd may be null: a model with no logged cost and no catalogue price (cost_source "unknown")
NOT_NULL_COLUMNS = ("decision_id", "role", "model", "task_complexity_score", "reward", "logged_reward",
                    "split", "data_source")
_EXAMPLES = 5  # unexpected values quoted per failed expectation


@dataclass(frozen=True)
class ExpectationOutcome:
    name: str  # expectation type and its columns, e.g. expect_column_values_to_be_between(reward)
    success: bool
    details: str  # column, unexpected count, a few unexpected values (or the error GX raised)


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    success: bool
    outcomes: list[ExpectationOutcome]

    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def to_markdown(self, failures_only: bool = False) -> str:
        """A table: expectation | ok | details (all expectations, or only the failed ones)."""
        esc = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        shown = self.failures() if failures_only else self.outcomes
        rows = [f"| {esc(o.name)} | {'yes' if o.success else '**no**'} | {esc(o.details)} |" for o in shown]
        return "\n".join([f"**{self.suite}**: {'passed' if self.success else 'FAILED'} "
                          f"({len(self.failures())} of {len(self.outcomes)} expectations failed)", "",
                          "| expectation | ok | details |", "|---|---|---|", *rows])


@dataclass(frozen=True)
class VolumeResult(SuiteResult):
    counts: dict[str, int]  # role -> rows, every role of the action space (0 when absent)
    min_rows_per_role: int

    @property
    def short(self) -> dict[str, int]:
        """Roles below the minimum, with their row counts."""
        return {r: n for r, n in self.counts.items() if n < self.min_rows_per_role}


def _gx() -> Any:
    os.environ["GX_ANALYTICS_ENABLED"] = "false"  # no usage statistics: validation must not reach the network
    import great_expectations as gx

    return gx


def contract_suite(space: ActionSpace) -> Any:
    """The blocking contract of the routing dataset, as a ``gx.ExpectationSuite``.

    Like every GX suite it needs an active GX context (``validate_contract`` makes one).
    """
    gx = _gx()
    E = gx.expectations
    exps: list[Any] = [E.ExpectColumnToExist(column=c) for c in DATASET_COLUMNS]
    exps += [E.ExpectColumnValuesToBeInTypeList(column=c, type_list=NUMERIC_TYPES) for c in NUMERIC_COLUMNS]
    exps += [E.ExpectColumnValuesToBeInTypeList(column=c, type_list=INTEGER_TYPES) for c in INTEGER_COLUMNS]
    # of_type "str" accepts pandas' str/string dtypes, and object columns whose every value is a str
    exps += [E.ExpectColumnValuesToBeOfType(column=c, type_="str") for c in STRING_COLUMNS]
    exps += [E.ExpectColumnValuesToNotBeNull(column=c) for c in NOT_NULL_COLUMNS]
    exps += [
        # between skips nulls (the not-null checks above catch NaN) but fails on +-inf
        E.ExpectColumnValuesToBeBetween(column="task_complexity_score", min_value=0.0, max_value=1.0),
        E.ExpectColumnValuesToBeBetween(column="reward", min_value=REWARD_MIN, max_value=REWARD_MAX),
        E.ExpectColumnValuesToBeBetween(column="logged_reward", min_value=REWARD_MIN, max_value=REWARD_MAX),
        # propensity in (0, 1]; null allowed: real logs may lack propensities
        E.ExpectColumnValuesToBeBetween(column="propensity", min_value=0.0, max_value=1.0, strict_min=True),
        *[E.ExpectColumnValuesToBeBetween(column=c, min_value=0) for c in
          ("step", "primary_failure_count", "failure_count", "cost_usd")],
        E.ExpectColumnValuesToBeInSet(column="role", value_set=list(space.roles)),
        E.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        E.ExpectColumnValuesToBeInSet(column="data_source", value_set=list(DATA_SOURCES)),
        E.ExpectColumnPairValuesToBeInSet(column_A="role", column_B="model", value_pairs_set=[
            (r, m) for r in space.roles for m in space.candidates(r)]),
        E.ExpectColumnValuesToBeUnique(column="decision_id"),
    ]
    suite = gx.ExpectationSuite(name="contract")
    for e in exps:
        suite.add_expectation(e)
    return suite


def volume_suite(roles: tuple[str, ...], min_rows_per_role: int = 500) -> Any:
    """One row-count expectation per role, on the rows where ``role`` is that role (needs a GX context)."""
    gx = _gx()
    from great_expectations.expectations.row_conditions import Column

    suite = gx.ExpectationSuite(name="volume")
    for r in roles:
        suite.add_expectation(gx.expectations.ExpectTableRowCountToBeBetween(
            min_value=min_rows_per_role, row_condition=Column("role") == r, meta={"role": r}))
    return suite


def _context() -> Any:
    """A fresh ephemeral GX context (in memory, no progress bars); GX needs one to build suites."""
    gx = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return context


def _run(context: Any, df: pd.DataFrame, suite: Any) -> list[Any]:
    """Validate ``df`` against ``suite``; the GX results, in suite order."""
    batch = (context.data_sources.add_pandas("routing").add_dataframe_asset("routing_dataset")
             .add_batch_definition_whole_dataframe("whole").get_batch(batch_parameters={"dataframe": df}))
    results = batch.validate(suite, result_format="SUMMARY").results
    order = {_key(e.configuration): i for i, e in enumerate(suite.expectations)}
    return sorted(results, key=lambda r: order.get(_key(r.expectation_config), len(order)))


def _key(cfg: Any) -> str:
    """Identity of an expectation across the suite and its result (which adds a batch_id)."""
    kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_id"}
    return json.dumps([cfg.type, kwargs, cfg.meta], sort_keys=True, default=str)


def _name(cfg: Any) -> str:
    kw = cfg.kwargs
    cols = [kw[k] for k in ("column", "column_A", "column_B") if k in kw]
    if "role" in cfg.meta:
        cols.append(f"role == {cfg.meta['role']!r}")
    return f"{cfg.type}({', '.join(map(str, cols))})"


def _error(res: Any) -> str | None:
    info = res.exception_info or {}
    msgs = [info["exception_message"]] if info.get("raised_exception") else [
        v["exception_message"] for v in info.values() if isinstance(v, dict) and v.get("raised_exception")]
    return "; ".join(dict.fromkeys(str(m).strip().splitlines()[0] for m in msgs if m)) or None


def _details(res: Any, columns: set[str]) -> str:
    cfg, out = res.expectation_config, res.result
    kw = cfg.kwargs
    absent = [kw[k] for k in ("column", "column_A", "column_B") if k in kw and kw[k] not in columns]
    where = f"columns ({kw['column_A']}, {kw['column_B']})" if "column_A" in kw else \
        f"column {kw['column']}" if "column" in kw else f"rows where role == {cfg.meta.get('role')!r}"
    if cfg.type == "expect_column_to_exist":
        return f"{where}: {'present' if res.success else 'missing'}"
    if absent:  # GX's own errors for an absent column can be cryptic ("list index out of range")
        return f"{where}: cannot check, {', '.join(absent)} missing"
    if (err := _error(res)) is not None:
        return f"{where}: error: {err}"
    if "unexpected_count" in out:
        n, total = out["unexpected_count"], out.get("element_count", 0)
        if not n:
            return f"{where}: 0 of {total} unexpected"
        counts = out.get("partial_unexpected_counts") or [{"value": v, "count": None}
                                                         for v in out.get("partial_unexpected_list", [])]
        eg = ", ".join(f"{c['value']!r}" + (f" x{c['count']}" if c["count"] else "")
                       for c in counts[:_EXAMPLES])
        return f"{where}: {n} of {total} unexpected, e.g. {eg}"
    observed = out.get("observed_value")
    if cfg.type == "expect_table_row_count_to_be_between":
        return f"{where}: {observed} rows (need >= {kw['min_value']})"
    expected = kw.get("type_list", kw.get("type_"))
    return f"{where}: observed {observed!r}" + ("" if res.success else f", expected {expected!r}")


def _outcomes(results: list[Any], df: pd.DataFrame) -> list[ExpectationOutcome]:
    cols = set(map(str, df.columns))
    return [ExpectationOutcome(_name(r.expectation_config), bool(r.success), _details(r, cols))
            for r in results]


def validate_contract(df: pd.DataFrame, space: ActionSpace) -> SuiteResult:
    """Run the blocking contract suite on the routing dataset."""
    context = _context()
    outcomes = _outcomes(_run(context, df, contract_suite(space)), df)
    return SuiteResult("contract", all(o.success for o in outcomes), outcomes)


def validate_volume(df: pd.DataFrame, roles: tuple[str, ...], min_rows_per_role: int = 500) -> VolumeResult:
    """Run the volume suite (a warning): at least ``min_rows_per_role`` rows for every role."""
    context = _context()
    results = _run(context, df, volume_suite(roles, min_rows_per_role))
    counts = {r.expectation_config.meta["role"]: int(r.result.get("observed_value") or 0)
              for r in results}
    outcomes = _outcomes(results, df)
    return VolumeResult("volume", all(o.success for o in outcomes), outcomes, counts, min_rows_per_role)
