"""Great Expectations suites for the routing dataset: a blocking contract and a volume warning.

``contract`` is what every consumer of ``routing_v1.parquet`` relies on: the documented
columns exist with the right types, values lie in their ranges (NaN and inf rewards fail),
every (role, model) pair is one the dataset's action space allows (roles from the routing
table, models from the table and the logs), and decision ids are unique.
``validate_contract_file`` runs the contract on the Parquet file in row batches, so its
memory does not grow with the logs. ``volume`` warns when a role has too few rows to learn
from; a role absent from the data is reported with 0 rows (the asset check judges only the roles
:func:`roles_to_judge` returns, and lists the others with why they have none). Both run on an
ephemeral GX context (no files, no network, no progress bars). GX is imported inside the
functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
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
    return _suite("contract", contract_expectations(space))


def _suite(name: str, exps: list[Any]) -> Any:
    suite = _gx().ExpectationSuite(name=name)
    for e in exps:
        suite.add_expectation(e)
    return suite


def contract_expectations(space: ActionSpace) -> list[Any]:
    """The contract's expectations, fresh objects on every call (a GX expectation belongs
    to one suite)."""
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
    return exps


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
    batch = (context.data_sources.add_or_update_pandas("routing").add_dataframe_asset("routing_dataset")
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


BATCH_ROWS = 500_000  # rows per GX batch when validating a Parquet file: bounds the check's memory


def _merge(per_batch: list[list[Any]]) -> list[Any]:
    """One result per expectation from its results on every batch: success when every batch
    succeeded, unexpected and element counts summed, examples from the failing batches."""
    merged = []
    for rs in zip(*per_batch, strict=True):
        out = dict(rs[0].result)
        failing = [r for r in rs if not r.success] or [rs[0]]
        if "unexpected_count" in out:
            out["unexpected_count"] = sum(int(r.result.get("unexpected_count") or 0) for r in rs)
            out["element_count"] = sum(int(r.result.get("element_count") or 0) for r in rs)
            counts: dict[Any, int] = {}
            for r in failing:
                for c in r.result.get("partial_unexpected_counts") or []:
                    counts[c["value"]] = counts.get(c["value"], 0) + int(c["count"] or 0)
            out["partial_unexpected_counts"] = [{"value": v, "count": n} for v, n in counts.items()][:_EXAMPLES]
            out["partial_unexpected_list"] = [v for r in failing
                                              for v in r.result.get("partial_unexpected_list") or []][:_EXAMPLES]
        elif "observed_value" in out:
            out["observed_value"] = failing[0].result.get("observed_value")
        merged.append(SimpleNamespace(expectation_config=rs[0].expectation_config, result=out,
                                      success=all(bool(r.success) for r in rs),
                                      exception_info=next((r.exception_info for r in rs if _error(r)),
                                                          rs[0].exception_info)))
    return merged


def validate_contract_file(path: str | Path, space: ActionSpace, batch_rows: int = BATCH_ROWS) -> SuiteResult:
    """The contract on a Parquet file, ``batch_rows`` rows at a time, so memory stays bounded
    on large logs: every expectation runs in GX on every batch and the results are merged
    (a batch of a file has the whole file's dtypes); the uniqueness of ``decision_id``,
    which spans batches, runs in GX on that one column read whole."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise FileNotFoundError(f"routing dataset {path} not found: materialize routing_dataset first")
    context = _context()
    exps = contract_expectations(space)
    is_unique = [isinstance(e, _gx().expectations.ExpectColumnValuesToBeUnique) for e in exps]
    per_row = _suite("contract_rows", [e for e, u in zip(exps, is_unique) if not u])
    unique = [e for e, u in zip(exps, is_unique) if u]
    pf = pq.ParquetFile(path)
    columns = pf.schema_arrow.names
    frames = (b.to_pandas() for b in pf.iter_batches(batch_size=batch_rows))
    per_batch, n_batches = [], 0
    for df in frames:
        per_batch.append(_run(context, df, per_row))
        n_batches += 1
    if not n_batches:  # an empty file: its empty frame, with the file's dtypes
        per_batch.append(_run(context, pf.schema_arrow.empty_table().to_pandas(), per_row))
    results = _merge(per_batch)
    if unique:
        id_cols = [e.column for e in unique if e.column in columns]
        results += _run(context, pq.read_table(path, columns=id_cols).to_pandas(), _suite("contract_unique", unique))
    order = {_key(e.configuration): i for i, e in enumerate(contract_suite(space).expectations)}
    results.sort(key=lambda r: order.get(_key(r.expectation_config), len(order)))
    cols = set(columns)
    outcomes = [ExpectationOutcome(_name(r.expectation_config), bool(r.success), _details(r, cols))
                for r in results]
    return SuiteResult("contract", all(o.success for o in outcomes), outcomes)


def roles_to_judge(df: pd.DataFrame, roles: tuple[str, ...], build_report: dict | None = None
                   ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The roles the volume warning judges (those of ``roles`` with at least one row), and for
    every other role why it has none: the logs never name it (SAGE's ``sage run`` never routes
    shell_router or shell_chat), or they do but none of its decisions has an outcome of its own
    (SAGE's planner and reviewer, see the build report's ``routing_decisions_unused``)."""
    present = set(df["role"].astype(str).unique())
    logged = set((build_report or {}).get("roles_logged") or [])
    judged = tuple(r for r in roles if r in present)
    without = {r: ("logged, but no decision of it has an observable outcome (see the build report's "
                   "routing_decisions_unused and not_joined)" if r in logged else "not in the logs")
               for r in roles if r not in present}
    return judged, without


def validate_volume(df: pd.DataFrame, roles: tuple[str, ...], min_rows_per_role: int = 500) -> VolumeResult:
    """Run the volume suite (a warning): at least ``min_rows_per_role`` rows for every role."""
    context = _context()
    results = _run(context, df, volume_suite(roles, min_rows_per_role))
    counts = {r.expectation_config.meta["role"]: int(r.result.get("observed_value") or 0)
              for r in results}
    outcomes = _outcomes(results, df)
    return VolumeResult("volume", all(o.success for o in outcomes), outcomes, counts, min_rows_per_role)
