"""Import routing-benchmark outcome tables: for every prompt, every model's quality and cost.

Three layouts are read (``layout="auto"`` tells them apart by their columns):

* ``routellm`` (lm-sys/RouteLLM's ``evals/*/responses`` CSVs): a ``prompt`` column, one
  correctness column per model (booleans or numbers), optional ``<model>_response``.
* ``routerbench`` (withmartian/routerbench, wide): ``sample_id``, ``prompt``, ``eval_name``,
  a quality column per model, ``<model>|total_cost`` and ``<model>|model_response``
  columns, ``oracle_model_to_route_to`` (ignored: the oracle is recomputed).
* ``long``: one row per (prompt, model): ``prompt_id``, ``model``, ``quality``, ``cost``;
  optional ``prompt``, ``eval_name`` and ``response``.

A path is one file or a folder of ``*.csv``, ``*.csv.gz`` and ``*.parquet`` files (sorted by
name; the file stem is the ``eval_name`` where a layout has none). Rows are numbered as
data records from 1 after the header (a quoted prompt may span several text lines).

Index columns that pandas writes (``DataFrame.to_csv`` with its default ``index=True``: the
leading columns with an empty header, ``Unnamed: N`` after a round trip through
``read_csv``; in Parquet the index columns its pandas metadata names) are dropped, never
taken for models, and listed in the report (``dropped_index_columns``).

Quality must lie in the table's declared scale (``quality_scale``; ``auto``: RouteLLM's
correctness columns are binary, 0 or 1; RouterBench's and the long layout's qualities lie in
[0, 1]). A value outside it is refused, whatever ``strict`` says: the import stops naming
the file, row, column and value, because a column on another scale is either not a model
or a table whose scale must be declared, and guessing which would corrupt every metric.

What is valid is imported; what is not is dropped and listed with its file, row, column,
value and reason (``strict=True`` raises at the first problem instead):

* a row whose quality is missing, not a number or not finite, whose cost is negative or
  not a number, or whose prompt is empty;
* a row whose cost cell is empty when nothing can fill it (the model has no price and there
  is no ``default_cost_per_call``) but the table has that model's costs elsewhere;
* a later duplicate of a prompt (same ``sample_id``/``prompt_id``/``question_id``, or for
  RouteLLM's layout the same prompt text): the first occurrence is kept;
* in the long layout, a prompt that lacks a row for some model;
* a whole file that is empty, unreadable, or lacks one of the table's models (the
  configured ``models``, else those of the first file). A model that only some files
  have is ignored there and reported, so every kept prompt has every model;
* a whole file in which a model's quality is empty in every row, or (as above) its cost:
  one file-level entry, not one per row. Its prompts cannot have every model's quality;
  leaving the model out of the whole table instead (the ``models`` option) would usually
  lose far more good cells, so that is the user's choice, and the entry says how.

Every message and entry names the column as the file names it (``sample_id``,
``question_id``, ``<model>|total_cost``, ...), not the importer's internal name.

Prompts listed in an exclusion file (RouteLLM's ``contaminated_prompts.jsonl``: JSON
lines with ``eval_prompt``) are excluded and counted apart from the dropped rows.

Costs missing from a table come from a :class:`PriceTable` (prompt and response length in
tokens, estimated as characters / ``chars_per_token``, times per-token prices) or from
``default_cost_per_call``; every cell records where its cost came from
(:data:`COST_SOURCES`) and the report counts them per model. A model with no cost anywhere in the
table and no price is a configuration error: the import stops and asks for a price.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from sage_pipeline.errors import ConfigError

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).with_name("data")
DEFAULT_TABLE = DATA_DIR / "routellm_mmlu"
DEFAULT_PRICES = DATA_DIR / "benchmark_prices.yaml"
AUTO_EXCLUDE = "contaminated_prompts.jsonl"  # looked for next to the table when exclude_prompts="auto"

DATA_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".jsonl", ".jsonl.gz")
# where a cell's cost came from (BenchmarkTable.cost_source holds the index)
COST_SOURCES = ("table", "price_table_tokens", "price_table_default_output", "default_cost_per_call")
META_COLUMNS = {"prompt", "prompt_id", "sample_id", "eval_name", "oracle_model_to_route_to", "split"}
LONG_REQUIRED = ("prompt_id", "model", "quality")
# judgement-style names of the long layout's columns (MT-Bench / FastChat: question_id, model, score, turn)
LONG_ALIASES = {"prompt_id": "question_id", "quality": "score"}


QUALITY_SCALES = {"routellm": "binary", "routerbench": "unit", "long": "unit"}  # what quality_scale="auto" means
_UNNAMED = re.compile(r"^(Unnamed: \d+(_level_\d+)?)?$")  # pandas' names for a header cell left empty


class BenchmarkImportError(ValueError):
    """A benchmark table (or an option of its import) cannot be used: names file, row, column."""

    def __init__(self, file: object, problem: str, *, row: int | None = None, column: str | None = None,
                 fix: str = "") -> None:
        self.file, self.row, self.column, self.problem = str(file), row, column, problem
        where = str(file) + (f": row {row}" if row is not None else "") + (
            f": column {column!r}" if column is not None else "")
        super().__init__(f"{where}: {problem}" + (f" ({fix})" if fix else ""))


# ----------------------------------------------------------------------------- prices
@dataclass(frozen=True)
class ModelPrice:
    input_per_mtok: float = 0.0  # USD per 1M input tokens
    output_per_mtok: float = 0.0  # USD per 1M output tokens
    per_call: float = 0.0  # USD per call
    default_output_tokens: float | None = None  # overrides the table-wide value
    source: str = ""  # where the price comes from (shown in the report)


@dataclass(frozen=True)
class PriceTable:
    """Per-model prices for costs a benchmark table lacks (see ``data/benchmark_prices.yaml``)."""

    models: dict[str, ModelPrice]
    chars_per_token: float = 4.0
    default_output_tokens: float = 1.0
    input_tokens_per_call: float = 0.0
    source: str = "<memory>"

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PRICES) -> PriceTable:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(path, "<file>", "price table not found",
                              "point the routing_benchmark config's price_table at a YAML price table")
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
            raise ConfigError(path, "models", "expected a mapping of model name -> prices")

        def num(d: dict, key: str, where: str, default: float | None, positive: bool = False) -> float | None:
            val = d.get(key, default)
            if val is None:
                return None
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
                raise ConfigError(path, where, f"expected a finite number, got {val!r}")
            if val < 0 or (positive and val == 0):
                raise ConfigError(path, where, f"must be {'> 0' if positive else '>= 0'}, got {val}")
            return float(val)

        models = {}
        for name, spec in doc["models"].items():
            where = f"models.{name}"
            if not isinstance(spec, dict):
                raise ConfigError(path, where, "expected a mapping with input_per_mtok, output_per_mtok, per_call")
            unknown = set(spec) - {f for f in ModelPrice.__dataclass_fields__}
            if unknown:
                raise ConfigError(path, where, f"unknown keys {sorted(unknown)}",
                                  "use input_per_mtok, output_per_mtok, per_call, default_output_tokens, source")
            models[str(name)] = ModelPrice(
                input_per_mtok=num(spec, "input_per_mtok", f"{where}.input_per_mtok", 0.0),
                output_per_mtok=num(spec, "output_per_mtok", f"{where}.output_per_mtok", 0.0),
                per_call=num(spec, "per_call", f"{where}.per_call", 0.0),
                default_output_tokens=num(spec, "default_output_tokens", f"{where}.default_output_tokens", None),
                source=str(spec.get("source", "")))
        return cls(models, chars_per_token=num(doc, "chars_per_token", "chars_per_token", 4.0, positive=True),
                   default_output_tokens=num(doc, "default_output_tokens", "default_output_tokens", 1.0),
                   input_tokens_per_call=num(doc, "input_tokens_per_call", "input_tokens_per_call", 0.0),
                   source=str(path))

    def tokens(self, chars: np.ndarray) -> np.ndarray:
        return np.ceil(np.maximum(chars, 0) / self.chars_per_token)

    def cost(self, model: str, prompt_chars: np.ndarray, response_chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(USD per call, COST_SOURCES index) for ``model``; ``response_chars < 0``: response unknown."""
        p = self.models[model]
        known = response_chars >= 0
        default_out = p.default_output_tokens if p.default_output_tokens is not None else self.default_output_tokens
        out_tokens = np.where(known, self.tokens(response_chars), default_out)
        in_tokens = self.tokens(prompt_chars) + self.input_tokens_per_call
        usd = (in_tokens * p.input_per_mtok + out_tokens * p.output_per_mtok) / 1e6 + p.per_call
        return usd, np.where(known, 1, 2).astype(np.int8)


# ----------------------------------------------------------------------------- config and results
def _fspath(v: Any) -> Any:
    return os.fspath(v) if isinstance(v, os.PathLike) else v


PathText = Annotated[str, BeforeValidator(_fspath)]  # a path, given as text or as a Path


class ImportConfig(BaseModel):
    """Which table to import and how to read it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: PathText = Field(str(DEFAULT_TABLE), min_length=1, description="the table: a file or a folder of *.csv, "
                           "*.csv.gz, *.parquet, *.jsonl(.gz) files (default: the packaged RouteLLM MMLU outcomes)")
    layout: Literal["auto", "routellm", "routerbench", "long"] = Field(
        "auto", description="auto (told apart by the columns), routellm, routerbench (wide) or long")
    models: list[str] = Field([], description="the table's models; empty: those of the first file")
    exclude_prompts: PathText | None = Field(
        "auto", description="JSON lines of prompts to exclude (RouteLLM's contaminated_prompts.jsonl; relative to "
                            "the table's folder); 'auto': that file beside the table if present; null or '': none")
    price_table: PathText | None = Field(str(DEFAULT_PRICES), min_length=1, description="YAML price table for "
                                         "costs the table lacks (default: the packaged one); null: none")
    default_cost_per_call: float | None = Field(None, ge=0.0, allow_inf_nan=False, description="USD per call for a "
                                                "cost cell the table leaves empty and the price table cannot fill (a "
                                                "finite number >= 0); null: a model with no cost anywhere and no "
                                                "price is an error, and an empty cost cell of a model without a "
                                                "price drops its row (its file, if the file has none of its costs)")
    strict: bool = Field(False, description="raise at the first bad row or file (naming file, row and column) "
                                            "instead of dropping it and listing it in the import report")
    max_listed: int = Field(200, ge=0, description="dropped rows listed one by one in the report (all are counted)")
    quality_scale: str = Field("auto", description="the quality's declared scale: auto (RouteLLM: binary; "
                               "RouterBench and long: [0, 1]), binary (0 or 1), unit ([0, 1]) or LO..HI (e.g. 1..10 "
                               "for MT-Bench judge scores); a quality outside it stops the import naming file, row "
                               "and column")
    embedding: str = Field("", description="precomputed prompt embeddings: a column holding a list of numbers per "
                           "prompt, or a prefix ending in '*' (emb_*) naming one column per dimension; '': none. "
                           "Never taken for models")

    @field_validator("quality_scale")
    @classmethod
    def _known_scale(cls, v: str) -> str:
        parse_quality_scale(v)
        return v

    def under(self, root: str | os.PathLike[str]) -> ImportConfig:
        """This config with a relative ``path`` and ``price_table`` resolved against ``root``
        (``exclude_prompts`` is relative to the table's folder)."""
        return self.model_copy(update={"path": str(Path(root) / self.path)} | (
            {"price_table": str(Path(root) / self.price_table)} if self.price_table is not None else {}))


def parse_quality_scale(scale: str, where: object = "quality_scale") -> tuple[float, float, bool] | None:
    """``(low, high, binary)`` of a declared quality scale; None for "auto" (the layout decides)."""
    if scale == "auto":
        return None
    if scale == "binary":
        return 0.0, 1.0, True
    if scale == "unit":
        return 0.0, 1.0, False
    lo, sep, hi = str(scale).partition("..")
    try:
        low, high = float(lo), float(hi)
    except ValueError:
        low = high = float("nan")
    if not sep or not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise BenchmarkImportError(where, f"quality_scale must be 'auto', 'binary', 'unit' or 'LO..HI' with "
                                          f"finite LO < HI (e.g. '1..10'), got {scale!r}", column="quality_scale")
    return low, high, False


class QualityScaleError(BenchmarkImportError):
    """A quality outside the table's declared scale: refused whatever ``strict`` says."""


@dataclass(frozen=True)
class Dropped:
    file: str
    row: int | None  # data record from 1 after the header; None: the whole file
    column: str | None
    reason: str
    value: str | None = None

    def format(self) -> str:
        where = self.file + (f": row {self.row}" if self.row is not None else "") + (
            f": column {self.column!r}" if self.column else "")
        return f"{where}: {self.reason}" + (f" (value {self.value})" if self.value is not None else "")


@dataclass
class ImportReport:
    source: str
    layouts: dict[str, str] = field(default_factory=dict)  # file -> layout
    rows_read: int = 0
    rows_kept: int = 0
    excluded: int = 0  # prompts in the exclusion list
    exclude_file: str | None = None
    dropped: list[Dropped] = field(default_factory=list)  # the first max_listed dropped rows
    dropped_rows: Counter = field(default_factory=Counter)  # reason -> rows
    dropped_files: list[Dropped] = field(default_factory=list)
    ignored_columns: list[str] = field(default_factory=list)  # "file: column (why)"
    aggregated: list[str] = field(default_factory=list)  # "file: what was averaged over turns"
    dropped_index_columns: list[str] = field(default_factory=list)  # "file: column N 'header' (what it held)"
    quality_scale: dict[str, str] = field(default_factory=dict)  # layout -> the scale its qualities were checked on
    cost_sources: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> source -> cells
    price_sources: dict[str, str] = field(default_factory=dict)  # model -> where its price comes from
    seconds: float = 0.0

    @property
    def n_dropped(self) -> int:
        return int(sum(self.dropped_rows.values()))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dropped_rows"] = dict(self.dropped_rows)
        d["n_dropped"] = self.n_dropped
        return d

    def dropped_table(self) -> list[dict]:
        return [{"reason": k, "rows": v} for k, v in self.dropped_rows.most_common()] + [
            {"reason": f"file dropped: {d.format()}", "rows": None} for d in self.dropped_files]

    def cost_table(self) -> list[dict]:
        return [{"model": m, **{s: c.get(s, 0) for s in COST_SOURCES},
                 "price source": self.price_sources.get(m, "")} for m, c in self.cost_sources.items()]


@dataclass(frozen=True)
class BenchmarkTable:
    """Full-information outcomes: ``quality[i, k]`` and ``cost[i, k]`` of model ``models[k]`` on prompt i."""

    prompt_id: np.ndarray  # object str
    prompt: np.ndarray  # object str ("" where the table has no text)
    eval_name: np.ndarray  # object str
    models: tuple[str, ...]
    quality: np.ndarray  # (n, K) float64
    cost: np.ndarray  # (n, K) float64 USD
    cost_source: np.ndarray  # (n, K) int8 index into COST_SOURCES
    file: np.ndarray  # int32 index into files
    row: np.ndarray  # int64 data record in its file
    files: tuple[str, ...]
    split: np.ndarray | None = None  # object str: the table's own ``split`` column ("" where none)
    embedding: np.ndarray | None = None  # (n, d) float32: precomputed prompt embeddings (ImportConfig.embedding)

    def __len__(self) -> int:
        return len(self.prompt_id)

    def take(self, idx: np.ndarray) -> BenchmarkTable:
        return BenchmarkTable(self.prompt_id[idx], self.prompt[idx], self.eval_name[idx], self.models,
                              self.quality[idx], self.cost[idx], self.cost_source[idx], self.file[idx],
                              self.row[idx], self.files, None if self.split is None else self.split[idx],
                              None if self.embedding is None else self.embedding[idx])

    def concat(self, other: BenchmarkTable) -> BenchmarkTable:
        """This table's prompts then ``other``'s (same models, in the same order)."""
        if other.models != self.models:
            raise ValueError(f"cannot join tables with models {list(self.models)} and {list(other.models)}")
        if (self.embedding is None) != (other.embedding is None) or (
                self.embedding is not None and self.embedding.shape[1] != other.embedding.shape[1]):
            raise ValueError("cannot join tables whose embeddings differ (one has none, or other dimensions)")

        def cat(name: str) -> np.ndarray | None:
            a, b = getattr(self, name), getattr(other, name)
            if name == "split":
                a = a if a is not None else np.full(len(self), "", dtype=object)
                b = b if b is not None else np.full(len(other), "", dtype=object)
            return None if a is None else np.concatenate([a, b])

        return BenchmarkTable(cat("prompt_id"), cat("prompt"), cat("eval_name"), self.models, cat("quality"),
                              cat("cost"), cat("cost_source"),
                              np.concatenate([self.file, other.file + len(self.files)]), cat("row"),
                              self.files + other.files, cat("split"), cat("embedding"))

    @property
    def binary_quality(self) -> bool:
        return bool(np.isin(self.quality, (0.0, 1.0)).all())

    def group_key(self) -> np.ndarray:
        """What a train/test split must keep together: the prompt text (ids where there is none)."""
        return np.where(self.prompt != "", self.prompt, self.prompt_id)

    def sha256(self) -> str:
        h = hashlib.sha256(json.dumps(list(self.models)).encode())
        for arr in (self.prompt_id, self.prompt):
            h.update("\x1f".join(arr.tolist()).encode("utf-8", "surrogatepass"))
        for arr in (self.quality, self.cost):
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()


# ----------------------------------------------------------------------------- reading
def data_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BenchmarkImportError(path, "no such file or folder",
                                   fix="set the routing_benchmark config's path to a table file or folder")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(DATA_SUFFIXES)
                   and p.name != AUTO_EXCLUDE)  # RouteLLM's exclusion list is JSON lines too
    if not files:
        raise BenchmarkImportError(path, f"no data files ({', '.join('*' + s for s in DATA_SUFFIXES)}) in the "
                                         "folder", fix="point path at a folder of benchmark tables")
    return files


def _stem(path: Path) -> str:
    """The file's name without its data suffix, and without a split suffix (``mmlu_train.csv`` and
    ``mmlu_test.csv`` are both ``mmlu``): the eval_name where the table has none."""
    name = path.name
    for suffix in sorted(DATA_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return re.sub(r"[_.-](train|test)$", "", name, flags=re.IGNORECASE) or name


def read_jsonl(path: Path, on_bad: Callable[[int, str], None] | None = None) -> tuple[pa.Table, np.ndarray]:
    """JSON lines (optionally gzip'd): one object per line, blank lines skipped; its scalar fields as
    columns (numbers, booleans, text; a field mixing them is read as text), nested ones left out.
    Returns the table and each record's line number. A line that is not a JSON object goes to
    ``on_bad(line, reason)``; without one it stops the import naming the file and line."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    records, lines = [], []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    problem = None if isinstance(obj, dict) else f"not a JSON object ({type(obj).__name__})"
                except json.JSONDecodeError as exc:
                    problem = f"not a JSON line ({exc.msg} at character {exc.pos})"
                if problem is not None:
                    if on_bad is None:
                        raise BenchmarkImportError(path, problem, row=i,
                                                   fix="one JSON object per line, e.g. {\"question_id\": 81, "
                                                       "\"model\": \"gpt-4\", \"score\": 9}")
                    on_bad(i, problem)
                    continue
                records.append(obj)
                lines.append(i)
    except UnicodeDecodeError as exc:
        raise BenchmarkImportError(path, f"not UTF-8 text: {exc}", fix="save the file as UTF-8") from exc
    keys = list(dict.fromkeys(k for r in records for k in r))
    cols = {}
    for k in keys:
        vals = [r.get(k) for r in records]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in v) for v in present):
            cols[k] = pa.array(vals, pa.list_(pa.float64()))  # an embedding
            continue
        if any(isinstance(v, (dict, list)) for v in present):
            continue  # nested (judge prompts, message lists): not a table column
        if present and all(isinstance(v, bool) for v in present):
            cols[k] = pa.array(vals, pa.bool_())
        elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            cols[k] = pa.array([None if v is None else float(v) for v in vals], pa.float64())
        else:
            cols[k] = pa.array([None if v is None else str(v) for v in vals], pa.string())
    return pa.table(cols), np.asarray(lines, dtype=np.int64)


def read_table_file(path: Path) -> pa.Table:
    """A CSV (optionally gzip'd) or Parquet file as an Arrow table (quoted values may hold newlines)."""
    if path.name.lower().endswith(".parquet"):
        return pq.read_table(path)
    if path.stat().st_size == 0:
        return pa.table({})
    return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(newlines_in_values=True),
                          read_options=pacsv.ReadOptions(block_size=16 << 20))


def _describe_index(col: pa.ChunkedArray) -> str:
    vals = col.to_numpy(zero_copy_only=False) if len(col) else np.array([])
    if pa.types.is_integer(col.type) and len(vals) and (vals == np.arange(len(vals))).all():
        return f"row numbers 0..{len(vals) - 1}"
    shown = ", ".join(str(v) for v in vals[:3]) + (", ..." if len(vals) > 3 else "")
    return f"{col.type} values {shown}"


def drop_index_columns(tbl: pa.Table, file: str) -> tuple[pa.Table, list[str]]:
    """Remove the index columns pandas wrote with the data; return the table and what was removed.

    CSV: the leading columns whose header is empty (``DataFrame.to_csv`` writes the index first,
    under an empty header when it has no name, one column per level) or ``Unnamed: N`` (the
    name ``read_csv`` gives such a column, when a table went through pandas twice). Parquet: the
    columns its ``pandas`` metadata lists as ``index_columns`` (a RangeIndex is stored as
    metadata only, so there is no column to drop). A named CSV index (``idx``, ...) looks like any
    other column: as a model it fails the quality-scale check, whose message says so.
    """
    names = tbl.column_names
    drop: list[int] = []
    meta = tbl.schema.pandas_metadata if tbl.schema.metadata and b"pandas" in tbl.schema.metadata else None
    if meta:
        index_names = {c for c in meta.get("index_columns", []) if isinstance(c, str)}
        drop = [i for i, c in enumerate(names) if c in index_names]
    else:
        while len(drop) < len(names) and _UNNAMED.match(names[len(drop)]):
            drop.append(len(drop))
    if not drop:
        return tbl, []
    out = [f"{file}: column {i + 1} {names[i]!r} (pandas index: {_describe_index(tbl.column(i))})" for i in drop]
    return tbl.select([i for i in range(len(names)) if i not in drop]), out


def check_quality_scale(values: np.ndarray, valid: np.ndarray, scale: tuple[float, float, bool], file: str,
                        column: str, layout: str, declared: str, wide: bool, rows: np.ndarray | None = None) -> None:
    """Refuse (:class:`QualityScaleError`) the first quality outside the declared scale."""
    low, high, binary = scale
    bad = valid & ((values < low) | (values > high) | ((values != low) & (values != high) if binary else False))
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    v = values[valid]
    what = "0 or 1" if binary else f"in [{low:g}, {high:g}]"
    origin = f"quality_scale {declared!r}" if declared != "auto" else f"the {layout} layout's scale"
    integral = bool(np.all(v == np.round(v)))
    looks_like_index = wide and integral and v.max() > high and len(np.unique(v)) == len(v)
    if looks_like_index:
        fix = (f"its {int(bad.sum())} values are distinct integers up to {v.max():g}: row numbers or ids, not a "
               "model's quality (an index column written by pandas under a name?). List the table's models in "
               "the config's models option so this column is ignored, or remove it")
    elif wide:
        fix = (f"{int(bad.sum())} of {int(valid.sum())} values lie outside, from {v.min():g} to {v.max():g}. If "
               f"{column!r} is not a model, list the table's models in the config's models option so it is "
               "ignored; if it is a model whose quality uses another scale, declare that scale with quality_scale "
               "(e.g. 'LO..HI'); if these cells are wrong, fix or remove those rows")
    else:
        fix = (f"{int(bad.sum())} of {int(valid.sum())} values lie outside, from {v.min():g} to {v.max():g}. If the "
               "table's qualities use another scale, declare it with quality_scale (e.g. 'LO..HI'); if these "
               "cells are wrong, fix or remove those rows")
    raise QualityScaleError(file, f"quality {values[i]:g} is not {what} ({origin})",
                            row=int(rows[i]) if rows is not None else i + 1, column=column,
                            fix=fix)


@dataclass
class _Problems:
    """Rows to drop in one file, with the first few listed."""

    file: str
    n: int
    strict: bool
    report: ImportReport
    max_listed: int
    rows: np.ndarray | None = None  # the row (JSON lines: line) number of each record; None: 1, 2, ...
    bad: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.bad = np.zeros(self.n, dtype=bool)

    def row(self, i: int | np.ndarray):
        return (self.rows[i] if self.rows is not None else np.asarray(i) + 1).astype(np.int64) \
            if isinstance(i, np.ndarray) else int(self.rows[i] if self.rows is not None else i + 1)

    def add(self, mask: np.ndarray, column: str | None, reason: str, values: np.ndarray | None = None) -> None:
        mask = mask & ~self.bad  # one reason per row: the first found
        if not mask.any():
            return
        rows = np.flatnonzero(mask)
        if self.strict:
            i = int(rows[0])
            raise BenchmarkImportError(self.file, reason + (f" (value {values[i]!r})" if values is not None else ""),
                                       row=self.row(i), column=column,
                                       fix=f"{len(rows)} such rows; fix them or import with strict=False to "
                                           "drop them")
        self.bad |= mask
        self.report.dropped_rows[reason] += len(rows)
        room = self.max_listed - len(self.report.dropped)
        for i in rows[:max(room, 0)]:
            self.report.dropped.append(Dropped(self.file, self.row(int(i)), column, reason,
                                               None if values is None else repr(values[i])[:80]))


def _strings(col: pa.ChunkedArray | None, n: int) -> np.ndarray:
    """Object array of str ('' for null)."""
    if col is None:
        return np.full(n, "", dtype=object)
    col = pc.fill_null(pc.cast(col, pa.string()), "")
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)


def _lengths(col: pa.ChunkedArray | None, n: int) -> np.ndarray:
    """Characters per value; -1 where null or no column."""
    if col is None:
        return np.full(n, -1, dtype=np.int64)
    lens = pc.utf8_length(pc.cast(col, pa.string()))
    return pc.fill_null(lens, -1).to_numpy(zero_copy_only=False).astype(np.int64)


_TRUE = {"true", "t", "yes", "y"}
_FALSE = {"false", "f", "no", "n"}


def _numbers(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, missing mask, not-a-number mask) of a quality or cost column: booleans,
    numbers, or text holding them (true/false/yes/no, any case)."""
    t = col.type
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t):
        vals = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
        missing = np.isnan(vals) if not pa.types.is_floating(t) else pc.is_null(col).to_numpy(
            zero_copy_only=False)
        return vals, np.asarray(missing, dtype=bool), np.zeros(len(vals), dtype=bool)
    raw = pd.Series(np.asarray(pc.cast(col, pa.string()).to_numpy(zero_copy_only=False), dtype=object))
    text = raw.fillna("").astype(str).str.strip()
    low = text.str.lower()
    vals = pd.to_numeric(text.where(~low.isin(_TRUE | _FALSE)), errors="coerce").to_numpy(np.float64)
    vals = np.where(low.isin(_TRUE), 1.0, np.where(low.isin(_FALSE), 0.0, vals))
    missing = (text == "").to_numpy() | low.isin({"nan", "null", "none", "na", "n/a"}).to_numpy()
    notnum = np.isnan(vals) & ~missing
    return vals, missing, notnum


@dataclass
class _Chunk:
    file: str
    layout: str
    models: tuple[str, ...]
    prompt_id: np.ndarray
    prompt: np.ndarray
    prompt_chars: np.ndarray
    eval_name: np.ndarray
    quality: np.ndarray  # (n, K_file)
    cost: np.ndarray  # (n, K_file), NaN: missing
    response_chars: np.ndarray  # (n, K_file), -1: unknown
    row: np.ndarray
    dedup_by: str  # "id" or "prompt"
    split: np.ndarray | None = None  # object str ("" where the file has no split column)
    embedding: np.ndarray | None = None  # (n, d) float32
    id_column: str = "prompt"  # the file's own name of the column duplicates are found by
    cost_columns: tuple[str | None, ...] = ()  # per model: the file's cost column (None: none)
    cost_rows: np.ndarray | None = None  # (n, K_file): row of the record whose cost is missing (long); None: row

    def keep(self, mask: np.ndarray) -> _Chunk:
        return _Chunk(self.file, self.layout, self.models, self.prompt_id[mask], self.prompt[mask],
                      self.prompt_chars[mask], self.eval_name[mask], self.quality[mask], self.cost[mask],
                      self.response_chars[mask], self.row[mask], self.dedup_by,
                      None if self.split is None else self.split[mask],
                      None if self.embedding is None else self.embedding[mask], self.id_column, self.cost_columns,
                      None if self.cost_rows is None else self.cost_rows[mask])


def _no_values(file: str, models: list[str], column: str, n: int) -> BenchmarkImportError:
    """Models whose quality is empty in every row of a file: one problem for the file, not one per row.
    The file is dropped (its prompts cannot have every model's quality); leaving the models out of the
    whole table instead would usually lose more good cells, so the message says how to choose that."""
    what = f"model {models[0]!r} has" if len(models) == 1 else f"models {models} have"
    them = repr(models[0]) if len(models) == 1 else "them"
    return BenchmarkImportError(
        file, f"{what} no values in this file (all {n} rows empty): none of its prompts can have every model's "
              f"quality (to keep them without {them}, leave {them} out of the models option)", column=column,
        fix="fill the column or remove the file, or import with strict=False to drop this file")


def detect_layout(columns: list[str], file: str) -> str:
    cols = set(columns)
    if all(c in cols or LONG_ALIASES.get(c) in cols for c in LONG_REQUIRED):
        return "long"
    if "sample_id" in cols or any("|" in c for c in columns):
        return "routerbench"
    if "prompt" in cols:
        return "routellm"
    raise BenchmarkImportError(file, f"cannot tell the layout from the columns {columns[:12]}",
                               fix="expected RouteLLM's (prompt, <model>...), RouterBench's wide (sample_id, "
                                   "prompt, <model>, <model>|total_cost, ...) or the long layout (prompt_id, "
                                   "model, quality, cost); or set layout")


def _embedding_columns(columns: list[str], spec: str) -> list[str]:
    if not spec:
        return []
    if spec.endswith("*"):
        return [c for c in columns if c.startswith(spec[:-1])]
    return [spec] if spec in columns else []


def _read_embedding(tbl: pa.Table, spec: str, file: str, probs: _Problems) -> np.ndarray | None:
    """(n, d) float32 embeddings from a list column or one column per dimension; bad rows dropped."""
    if not spec:
        return None
    cols, n = _embedding_columns(tbl.column_names, spec), tbl.num_rows
    if not cols:
        raise BenchmarkImportError(file, f"no embedding column matches {spec!r}", column=spec,
                                   fix="set embedding to a column holding a list of numbers per prompt, or to a "
                                       "prefix ending in '*' naming one column per dimension, or '' for none")
    if len(cols) == 1 and (pa.types.is_list(tbl.column(cols[0]).type)
                           or pa.types.is_large_list(tbl.column(cols[0]).type)):
        col = tbl.column(cols[0])
        lengths = pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)
        valid = lengths[lengths >= 0]
        d = int(np.bincount(valid).argmax()) if len(valid) else 0
        probs.add(lengths != d, cols[0], f"embedding does not hold {d} numbers (the most common length)",
                  lengths)
        out = np.zeros((n, d), dtype=np.float32)
        ok = np.flatnonzero(lengths == d)
        if len(ok) and d:
            flat = pc.list_flatten(col.take(pa.array(ok))).cast(pa.float64()).to_numpy(zero_copy_only=False)
            out[ok] = np.asarray(flat, dtype=np.float64).reshape(len(ok), d)
    else:
        out = np.zeros((n, len(cols)), dtype=np.float32)
        for j, c in enumerate(cols):
            vals, miss, notnum = _numbers(tbl.column(c))
            probs.add(notnum | miss, c, "embedding value is missing or not a number")
            out[:, j] = np.where(notnum | miss, 0.0, vals)
    probs.add(~np.isfinite(out).all(axis=1), cols[0], "embedding is not finite")
    return out


def _wide_models(columns: list[str], layout: str, file: str,
                 skip: frozenset[str] = frozenset()) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(model quality columns, model -> cost column, model -> response column); ``skip``: not models."""
    columns = [c for c in columns if c not in skip]
    cols = set(columns)
    cost_cols, resp_cols = {}, {}
    if layout == "routerbench":
        piped = {c.split("|", 1)[0] for c in columns if "|" in c}
        for m in sorted(piped):
            if m not in cols:
                raise BenchmarkImportError(file, f"model {m!r} has {m}|... columns but no quality column",
                                           column=m, fix=f"add the column {m!r} with its quality per prompt")
        for c in columns:
            if "|" in c:
                m, kind = c.split("|", 1)
                if kind == "total_cost":
                    cost_cols[m] = c
                elif kind == "model_response":
                    resp_cols[m] = c
        models = [c for c in columns if "|" not in c and c not in META_COLUMNS]
    else:
        responses = {c for c in columns if c.endswith("_response") and c[: -len("_response")] in cols}
        models = [c for c in columns if c not in META_COLUMNS and c not in responses]
        resp_cols = {c[: -len("_response")]: c for c in responses}
    if not models:
        raise BenchmarkImportError(file, f"no model columns among {columns[:12]}",
                                   fix="a wide table needs one quality column per model")
    return models, cost_cols, resp_cols


def _ignored(models: list[str] | tuple[str, ...], want: tuple[str, ...], file: str,
             report: ImportReport) -> list[str]:
    """The models to read (those wanted, when the table's models are known); report the others."""
    if not want:
        return list(models)
    report.ignored_columns += [f"{file}: {m} (model not in every file / not configured)"
                               for m in models if m not in want]
    return [m for m in models if m in want]


def _read_wide(tbl: pa.Table, file: str, stem: str, layout: str, probs: _Problems,
               want: tuple[str, ...] = (), quality_scale: str = "auto", embedding: str = "") -> _Chunk:
    columns, n = tbl.column_names, tbl.num_rows
    id_col = "sample_id" if layout == "routerbench" else ("prompt_id" if "prompt_id" in columns else None)
    required = ["prompt"] + (["sample_id"] if layout == "routerbench" else [])
    missing = [c for c in required if c not in columns]
    if missing:
        raise BenchmarkImportError(file, f"missing column(s) {missing} of the {layout} layout", column=missing[0],
                                   fix=f"columns found: {columns[:12]}")
    models, cost_cols, resp_cols = _wide_models(columns, layout, file,
                                                frozenset(_embedding_columns(columns, embedding)))
    models = _ignored(models, want, file, probs.report)
    parsed = {m: _numbers(tbl.column(m)) for m in models}
    empty = [m for m in models if parsed[m][1].all()]
    if empty:  # one file-level problem, raised before any row of the file is listed
        raise _no_values(file, empty, empty[0], n)
    emb = _read_embedding(tbl, embedding, file, probs)
    prompt = _strings(tbl.column("prompt"), n)
    probs.add(np.array([not p.strip() for p in prompt], dtype=bool), "prompt", "empty prompt")
    ids = _strings(tbl.column(id_col), n) if id_col else np.array([f"{stem}:{i}" for i in range(1, n + 1)],
                                                                    dtype=object)
    if id_col:
        probs.add(ids == "", id_col, "empty prompt id")
    quality = np.empty((n, len(models)))
    cost = np.full((n, len(models)), np.nan)
    resp = np.full((n, len(models)), -1, dtype=np.int64)
    for k, m in enumerate(models):
        vals, miss, notnum = parsed[m]
        probs.add(notnum, m, "quality is not a number", _strings(tbl.column(m), n) if notnum.any() else None)
        probs.add(miss, m, "quality is missing")
        probs.add(~np.isfinite(vals) & ~miss & ~notnum, m, "quality is not finite", vals)
        check_quality_scale(vals, np.isfinite(vals) & ~miss & ~notnum, _scale(quality_scale, layout), file, m,
                            layout, quality_scale, wide=True)
        quality[:, k] = vals
        if m in cost_cols:
            c = tbl.column(cost_cols[m])
            cv, cmiss, cnot = _numbers(c)
            probs.add(cnot, cost_cols[m], "cost is not a number", _strings(c, n) if cnot.any() else None)
            probs.add((cv < 0) | np.isinf(cv), cost_cols[m], "cost is negative or infinite", cv)
            cost[:, k] = np.where(cmiss, np.nan, cv)
        if m in resp_cols:
            resp[:, k] = _lengths(tbl.column(resp_cols[m]), n)
    eval_name = _strings(tbl.column("eval_name"), n) if "eval_name" in columns else np.full(n, stem, dtype=object)
    split = _strings(tbl.column("split"), n) if "split" in columns else None
    return _Chunk(file, layout, tuple(models), ids, prompt, _lengths(tbl.column("prompt"), n), eval_name,
                  quality, cost, resp, probs.row(np.arange(n)), "id" if id_col else "prompt", split, emb,
                  id_col or "prompt", tuple(cost_cols.get(m) for m in models))


def _scale(declared: str, layout: str) -> tuple[float, float, bool]:
    return parse_quality_scale(QUALITY_SCALES[layout] if declared == "auto" else declared)


def _read_long(tbl: pa.Table, file: str, stem: str, probs: _Problems, report: ImportReport,
               want: tuple[str, ...] = (), quality_scale: str = "auto", embedding: str = "") -> _Chunk:
    columns, n = tbl.column_names, tbl.num_rows
    name = {c: c if c in columns or LONG_ALIASES.get(c) not in columns else LONG_ALIASES[c] for c in LONG_REQUIRED}
    missing = [c for c in LONG_REQUIRED if name[c] not in columns]
    if missing:
        raise BenchmarkImportError(file, f"missing column(s) {missing} of the long layout", column=missing[0],
                                   fix=f"columns found: {columns[:12]} (judgement tables may name them "
                                       "question_id and score)")
    pid_col, q_col = name["prompt_id"], name["quality"]
    ids = _strings(tbl.column(pid_col), n)
    model = _strings(tbl.column("model"), n)
    turn = _strings(tbl.column("turn"), n) if "turn" in columns else None
    if want:  # rows of other models are ignored (and reported), not validated
        keep_models = set(_ignored(list(pd.unique(model[model != ""])), want, file, report))
        other = np.array([m not in keep_models for m in model], dtype=bool)
        probs.bad |= other
    q, qmiss, qnot = _numbers(tbl.column(q_col))
    counted = (model != "") & ~probs.bad
    all_empty = pd.Series(qmiss[counted]).groupby(model[counted], sort=False).all()
    if all_empty.any():  # one file-level problem, raised before any row of the file is listed
        empty = [str(m) for m in all_empty.index[all_empty.to_numpy()]]
        raise _no_values(file, empty, q_col, int(np.isin(model, empty).sum()))
    probs.add(ids == "", pid_col, "empty prompt id")
    probs.add(model == "", "model", "empty model name")
    probs.add(qnot, q_col, "quality is not a number", _strings(tbl.column(q_col), n) if qnot.any() else None)
    probs.add(qmiss, q_col, "quality is missing")
    probs.add(~np.isfinite(q) & ~qmiss & ~qnot, q_col, "quality is not finite", q)
    check_quality_scale(q, np.isfinite(q) & ~qmiss & ~qnot & ~probs.bad, _scale(quality_scale, "long"), file,
                        q_col, "long", quality_scale, wide=False, rows=probs.rows)
    c = np.full(n, np.nan)
    if "cost" in columns:
        cv, cmiss, cnot = _numbers(tbl.column("cost"))
        probs.add(cnot, "cost", "cost is not a number", _strings(tbl.column("cost"), n) if cnot.any() else None)
        probs.add((cv < 0) | np.isinf(cv), "cost", "cost is negative or infinite", cv)
        c = np.where(cmiss, np.nan, cv)
    key = {"i": ids, "m": model} | ({"t": turn} if turn is not None else {})
    dup = pd.DataFrame(key).duplicated(keep="first").to_numpy()
    probs.add(dup, pid_col, f"duplicate ({', '.join([pid_col, 'model'] + (['turn'] if turn is not None else []))}) "
                            "row: the first one is kept", ids)
    prompt = _strings(tbl.column("prompt"), n) if "prompt" in columns else np.full(n, "", dtype=object)
    pchars = _lengths(tbl.column("prompt"), n) if "prompt" in columns else np.full(n, -1, dtype=np.int64)
    resp = _lengths(tbl.column("response"), n) if "response" in columns else np.full(n, -1, dtype=np.int64)
    evn = _strings(tbl.column("eval_name"), n) if "eval_name" in columns else np.full(n, stem, dtype=object)
    split = _strings(tbl.column("split"), n) if "split" in columns else None
    emb = _read_embedding(tbl, embedding, file, probs)

    ok = np.flatnonzero(~probs.bad)
    models = tuple(pd.unique(model[ok]))
    pid_codes, pid_uniq = pd.factorize(ids[ok])
    m_index = {m: k for k, m in enumerate(models)}
    mk = np.array([m_index[m] for m in model[ok]], dtype=np.int64)
    P, K = len(pid_uniq), len(models)
    # one cell per (prompt, model); with a turn column, a prompt's turns: quality averaged, cost and
    # response length summed (RouteLLM scores an MT-Bench question by its mean over both turns)
    turns = np.zeros((P, K), dtype=np.int64)
    np.add.at(turns, (pid_codes, mk), 1)
    have = turns > 0
    qsum, csum = np.zeros((P, K)), np.zeros((P, K))
    np.add.at(qsum, (pid_codes, mk), q[ok])
    np.add.at(csum, (pid_codes, mk), c[ok])  # NaN (no cost) stays NaN
    rsum = np.zeros((P, K), dtype=np.int64)
    np.add.at(rsum, (pid_codes, mk), np.maximum(resp[ok], 0))
    rknown = np.ones((P, K), dtype=bool)
    np.logical_and.at(rknown, (pid_codes, mk), resp[ok] >= 0)
    no_cost = np.isnan(c[ok])
    cost_rows = None
    if no_cost.any():  # the first record of each cell whose cost is missing, to name it if the cell is dropped
        first_missing = np.full((P, K), n, dtype=np.int64)
        np.minimum.at(first_missing, (pid_codes[no_cost], mk[no_cost]), ok[no_cost])
        cost_rows = probs.row(np.minimum(first_missing, n - 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        quality = np.where(have, qsum / np.maximum(turns, 1), np.nan)
    cost = np.where(have, csum, np.nan)
    resp_w = np.where(have & rknown, rsum, -1)
    if turn is not None and (turns > 1).any():
        report.aggregated.append(f"{file}: quality averaged over turns for {int((turns > 1).any(axis=1).sum())} "
                                 f"prompts (up to {int(turns.max())} turns), costs summed")
    first = np.full(P, -1, dtype=np.int64)
    first[pid_codes[::-1]] = ok[::-1]  # the first row of each prompt
    lacking = ~have.all(axis=1)
    uneven = ~lacking & (turns.min(axis=1) != turns.max(axis=1))
    for p in np.flatnonzero(lacking | uneven):
        if lacking[p]:
            absent = [models[k] for k in np.flatnonzero(~have[p])]
            reason, detail = "prompt lacks a row for some model", f"has no row for model(s) {absent}"
        else:
            absent = {models[k]: int(turns[p, k]) for k in range(K)}
            reason, detail = "models have different numbers of turns", f"has turns per model {absent}"
        report.dropped_rows[reason] += 1
        if probs.strict:
            raise BenchmarkImportError(file, f"prompt {pid_uniq[p]!r} {detail}", row=probs.row(int(first[p])),
                                       column="model", fix="every prompt needs one row per model (and turn); import "
                                                           "with strict=False to drop such prompts")
        if len(report.dropped) < probs.max_listed:
            report.dropped.append(Dropped(file, probs.row(int(first[p])), "model", reason, repr(absent)[:80]))
    keep = np.flatnonzero(~(lacking | uneven))
    f = first[keep]
    return _Chunk(file, "long", models, np.asarray(pid_uniq, dtype=object)[keep], prompt[f], pchars[f], evn[f],
                  quality[keep], cost[keep], resp_w[keep], probs.row(f), "id",
                  None if split is None else split[f], None if emb is None else emb[f], pid_col,
                  tuple("cost" if "cost" in columns else None for _ in models),
                  None if cost_rows is None else cost_rows[keep])


def _load_exclusions(path: Path) -> set[str]:
    out = set()
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkImportError(path, f"not a JSON line: {exc}", row=i,
                                           fix="one JSON object with eval_prompt (or prompt) per line") from exc
            text = obj if isinstance(obj, str) else (obj.get("eval_prompt", obj.get("prompt"))
                                                       if isinstance(obj, dict) else None)
            if not isinstance(text, str):
                raise BenchmarkImportError(path, "expected a JSON string or an object with eval_prompt",
                                           row=i, column="eval_prompt")
            out.add(text)
    return out


def _exclusion_file(cfg: ImportConfig, root: Path) -> Path | None:
    if cfg.exclude_prompts in (None, "", "none"):
        return None
    folder = root if root.is_dir() else root.parent
    if cfg.exclude_prompts == "auto":
        p = folder / AUTO_EXCLUDE
        return p if p.is_file() else None
    p = Path(cfg.exclude_prompts)
    p = p if p.is_absolute() else folder / p
    if not p.is_file():
        raise BenchmarkImportError(p, "exclusion list not found", column="exclude_prompts",
                                   fix="set exclude_prompts to a JSON-lines file, 'auto' or ''")
    return p


# ----------------------------------------------------------------------------- import
def import_benchmark(cfg: ImportConfig = ImportConfig(), log: Callable[[str], None] = logger.info
                     ) -> tuple[BenchmarkTable, ImportReport]:
    """Read, validate and assemble a benchmark table; see the module docstring."""
    t0 = time.perf_counter()
    root = Path(cfg.path)
    excl = _exclusion_file(cfg, root)
    files = [f for f in data_files(root) if excl is None or f.resolve() != excl.resolve()]
    report = ImportReport(source=str(root))
    prices = PriceTable.load(cfg.price_table) if cfg.price_table not in (None, "") else None
    chunks: list[_Chunk] = []
    want = tuple(cfg.models)
    last_log = t0
    for j, path in enumerate(files, start=1):
        file = str(path)
        lines = None
        try:
            if path.name.lower().endswith((".jsonl", ".jsonl.gz")):
                tbl, lines = read_jsonl(path, None if cfg.strict else
                                        lambda i, why, f=file: _bad_line(report, cfg, f, i, why))
            else:
                tbl = read_table_file(path)
        except (pa.ArrowInvalid, OSError, EOFError) as exc:
            _drop_file(report, cfg, file, f"cannot be read: {exc}".splitlines()[0][:200])
            continue
        except BenchmarkImportError as exc:
            if cfg.strict:
                raise
            _drop_file(report, cfg, file, f"line {exc.row}: {exc.problem}" if exc.row else exc.problem)
            continue
        if tbl.num_rows == 0:
            _drop_file(report, cfg, file, "empty file (no data rows)")
            continue
        report.rows_read += tbl.num_rows
        tbl, index_cols = drop_index_columns(tbl, file)
        report.dropped_index_columns += index_cols
        probs = _Problems(file, tbl.num_rows, cfg.strict, report, cfg.max_listed, lines)
        try:
            layout = cfg.layout if cfg.layout != "auto" else detect_layout(tbl.column_names, file)
            chunk = (_read_long(tbl, file, _stem(path), probs, report, want, cfg.quality_scale, cfg.embedding)
                     if layout == "long" else
                     _read_wide(tbl, file, _stem(path), layout, probs, want, cfg.quality_scale, cfg.embedding))
            low, high, binary = _scale(cfg.quality_scale, layout)
            report.quality_scale[layout] = "binary (0 or 1)" if binary else f"[{low:g}, {high:g}]"
        except BenchmarkImportError as exc:
            if cfg.strict or isinstance(exc, QualityScaleError):
                raise
            _drop_file(report, cfg, file, exc.problem, column=exc.column)
            continue
        report.layouts[file] = layout
        if layout != "long":
            keep = ~probs.bad
            chunk = chunk.keep(keep)
        if not want:
            want = chunk.models
        if chunk.embedding is not None and chunks and chunk.embedding.shape[1] != chunks[0].embedding.shape[1]:
            _drop_file(report, cfg, file, f"embeddings have {chunk.embedding.shape[1]} dimensions, "
                                          f"{chunks[0].file}'s have {chunks[0].embedding.shape[1]}",
                       column=cfg.embedding)
            continue
        absent = [m for m in want if m not in chunk.models]
        if absent:
            _drop_file(report, cfg, file, f"model column(s) {absent} missing (the table's models are "
                                          f"{list(want)})", column=absent[0])
            continue
        chunks.append(chunk)
        if time.perf_counter() - last_log > 5.0 or j == len(files):
            last_log = time.perf_counter()
            rows = sum(len(c.prompt_id) for c in chunks)
            log(f"benchmark import: {j}/{len(files)} files, {rows:,} rows kept of {report.rows_read:,} read, "
                f"{report.rows_read / max(last_log - t0, 1e-9):,.0f} rows/s")
    chunks = _drop_missing_costs(chunks, want, cfg, prices, report)
    if not chunks:
        raise BenchmarkImportError(root, "no valid rows: every file was dropped or empty ("
                                         + "; ".join(d.format() for d in report.dropped_files[:5]) + ")",
                                   fix="check the files listed")
    if sum(len(c.prompt_id) for c in chunks) == 0:
        raise BenchmarkImportError(root, f"no valid rows: all {report.rows_read:,} rows read were dropped ("
                                         + "; ".join(f"{k}: {v}" for k, v in report.dropped_rows.most_common(3))
                                         + "; first: " + (report.dropped[0].format() if report.dropped else "-") + ")",
                                   fix="check the listed rows, or the layout and models options")
    table = _assemble(chunks, want, cfg, root, report, prices)
    report.rows_kept = len(table)
    report.seconds = time.perf_counter() - t0
    log(f"benchmark import: {len(table):,} prompts x {len(want)} models from {len(chunks)} file(s) in "
        f"{report.seconds:.1f}s; {report.n_dropped:,} rows dropped, {report.excluded:,} excluded, "
        f"{len(report.dropped_files)} file(s) dropped")
    return table, report


def _bad_line(report: ImportReport, cfg: ImportConfig, file: str, line: int, reason: str) -> None:
    report.dropped_rows["not a JSON object"] += 1
    report.rows_read += 1
    if len(report.dropped) < cfg.max_listed:
        report.dropped.append(Dropped(file, line, None, reason))


def _drop_file(report: ImportReport, cfg: ImportConfig, file: str, reason: str, column: str | None = None,
               fix: str = "fix or remove the file, or import with strict=False to skip it") -> None:
    if cfg.strict:
        raise BenchmarkImportError(file, reason, column=column, fix=fix)
    report.dropped_files.append(Dropped(file, None, column, reason))


def _drop_missing_costs(chunks: list[_Chunk], models: tuple[str, ...], cfg: ImportConfig,
                        prices: PriceTable | None, report: ImportReport) -> list[_Chunk]:
    """Cost cells the table leaves empty where nothing can fill them (the model has no price and there is
    no default_cost_per_call), for a model whose costs the table has elsewhere: the rows are dropped and
    listed naming the file's cost column (strict: raise at the first); a file with no cost at all for such
    a model is one file-level entry. A model with no cost anywhere is left to _fill_costs, which stops
    the import asking for a price (a configuration problem, not bad input)."""
    if cfg.default_cost_per_call is not None:
        return chunks
    for m in models:
        if prices is not None and m in prices.models:
            continue
        have = [~np.isnan(c.cost[:, c.models.index(m)]) for c in chunks]
        if not any(h.any() for h in have):
            continue
        kept = []
        for c, h in zip(chunks, have):
            if h.all():
                kept.append(c)
                continue
            k = c.models.index(m)
            col = c.cost_columns[k] if c.cost_columns else None
            fix = (f"fill the cost cells, add {m!r} to the price table {cfg.price_table} or set "
                   "default_cost_per_call so they are filled, or ")
            if not h.any():
                what = f"its cost column {col!r} is empty" if col else "the file has no cost column for it"
                _drop_file(report, cfg, c.file, f"model {m!r} has no cost in this file ({what}; other files have "
                                                f"its costs) and no price to fill them, so none of the file's "
                                                f"{len(h)} prompts can be kept", column=col or m,
                           fix=fix + "import with strict=False to drop this file")
                continue
            rows = np.flatnonzero(~h)
            file_rows = c.cost_rows[rows, k] if c.cost_rows is not None else c.row[rows]
            reason = f"cost is missing and model {m!r} has no price"
            if cfg.strict:
                raise BenchmarkImportError(c.file, reason + " (nor a default_cost_per_call)", row=int(file_rows[0]),
                                           column=col, fix=f"{len(rows)} such rows in this file; " + fix
                                           + "import with strict=False to drop these rows")
            report.dropped_rows[reason] += len(rows)
            room = max(cfg.max_listed - len(report.dropped), 0)
            report.dropped += [Dropped(c.file, int(r), col, reason) for r in file_rows[:room]]
            kept.append(c.keep(h))
        chunks = kept
    return chunks


def _assemble(chunks: list[_Chunk], models: tuple[str, ...], cfg: ImportConfig, root: Path,
              report: ImportReport, prices: PriceTable | None) -> BenchmarkTable:
    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(c, name) for c in chunks])

    cols = [[c.models.index(m) for m in models] for c in chunks]
    quality = np.concatenate([c.quality[:, k] for c, k in zip(chunks, cols)])
    cost = np.concatenate([c.cost[:, k] for c, k in zip(chunks, cols)])
    resp = np.concatenate([c.response_chars[:, k] for c, k in zip(chunks, cols)])
    prompt_id, prompt, pchars, eval_name, row = (cat(n) for n in ("prompt_id", "prompt", "prompt_chars",
                                                                   "eval_name", "row"))
    files = tuple(c.file for c in chunks)
    file_idx = np.concatenate([np.full(len(c.prompt_id), i, dtype=np.int32) for i, c in enumerate(chunks)])
    by_prompt = np.concatenate([np.full(len(c.prompt_id), c.dedup_by == "prompt") for c in chunks])
    keep = np.ones(len(prompt_id), dtype=bool)

    excl_path = _exclusion_file(cfg, root)
    if excl_path is not None:
        excluded = pd.Series(prompt).isin(_load_exclusions(excl_path)).to_numpy()
        keep &= ~excluded
        report.excluded, report.exclude_file = int(excluded.sum()), str(excl_path)

    key = np.where(by_prompt, prompt, prompt_id)
    codes = pd.factorize(key)[0]
    kept = np.flatnonzero(keep)
    dup = np.zeros(len(key), dtype=bool)
    dup[kept] = pd.Series(codes[kept]).duplicated(keep="first").to_numpy()
    if dup.any():
        first_of = np.full(codes.max() + 1, -1, dtype=np.int64)
        order = np.flatnonzero(keep)[::-1]
        first_of[codes[order]] = order
        reason = "duplicate prompt: the first occurrence is kept"
        rows = np.flatnonzero(dup)
        if cfg.strict:
            i, f = int(rows[0]), int(first_of[codes[rows[0]]])
            raise BenchmarkImportError(files[file_idx[i]], f"{reason} ({files[file_idx[f]]} row {row[f]})",
                                       row=int(row[i]), column=chunks[file_idx[i]].id_column,
                                       fix="remove duplicates or import with strict=False")
        report.dropped_rows[reason] += len(rows)
        for i in rows[:max(cfg.max_listed - len(report.dropped), 0)]:
            f = int(first_of[codes[i]])
            report.dropped.append(Dropped(files[file_idx[i]], int(row[i]), chunks[file_idx[i]].id_column,
                                          f"{reason} ({Path(files[file_idx[f]]).name} row {row[f]})"))
        keep &= ~dup

    idx = np.flatnonzero(keep)
    cost, source = _fill_costs(cost[idx], pchars[idx], resp[idx], models, cfg, report, prices)
    split = (np.concatenate([c.split if c.split is not None else np.full(len(c.prompt_id), "", dtype=object)
                             for c in chunks])[idx] if any(c.split is not None for c in chunks) else None)
    emb = np.concatenate([c.embedding for c in chunks])[idx] if cfg.embedding else None
    return BenchmarkTable(prompt_id[idx].astype(str).astype(object), prompt[idx], eval_name[idx], models,
                          quality[idx], cost, source, file_idx[idx], row[idx], files, split, emb)


def _fill_costs(cost: np.ndarray, pchars: np.ndarray, resp: np.ndarray, models: tuple[str, ...],
                cfg: ImportConfig, report: ImportReport, prices: PriceTable | None) -> tuple[np.ndarray, np.ndarray]:
    source = np.zeros(cost.shape, dtype=np.int8)
    for k, m in enumerate(models):
        need = np.isnan(cost[:, k])
        if need.any():
            if prices is not None and m in prices.models:
                usd, src = prices.cost(m, pchars[need], resp[need, k])
                cost[need, k], source[need, k] = usd, src
                report.price_sources[m] = f"{prices.source}: {prices.models[m].source}".rstrip(": ")
            elif cfg.default_cost_per_call is not None:
                cost[need, k], source[need, k] = cfg.default_cost_per_call, 3
                report.price_sources[m] = f"default_cost_per_call = {cfg.default_cost_per_call} USD"
            else:
                raise BenchmarkImportError(
                    cfg.path, f"model {m!r} has no cost in the table for {int(need.sum())} prompts and no price in "
                              f"the price table {cfg.price_table}", column=m,
                    fix=f"add {m!r} to the price table, or set default_cost_per_call to the USD one call to it "
                        f"costs; if {m!r} is not a model, list the table's models in the models option instead")
        report.cost_sources[m] = {COST_SOURCES[s]: int(c) for s, c in
                                  zip(*np.unique(source[:, k], return_counts=True))}
    return cost, source
