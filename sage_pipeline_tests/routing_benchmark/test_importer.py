"""Importing benchmark outcome tables: the three layouts, costs and where they came from, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from sage_pipeline.errors import ConfigError
from sage_pipeline.routing_benchmark.importer import (
    COST_SOURCES,
    DEFAULT_TABLE,
    BenchmarkImportError,
    ImportConfig,
    PriceTable,
    import_benchmark,
)

SLICE = Path(__file__).parent / "fixtures" / "routellm_mmlu_slice"
WEAK, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"


def _imp(path, **kw):
    return import_benchmark(ImportConfig(path=path, **kw), log=lambda s: None)


def _routellm(rows: list[tuple], cols=("prompt", WEAK, STRONG)) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(cols))


def _write(folder: Path, name: str, df: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    df.to_csv(p, index=False)
    return p


# ----------------------------------------------------------------------------- good input
def test_routellm_slice_imports_with_exclusions_and_priced_costs():
    tab, rep = _imp(SLICE)
    assert rep.rows_read == 360 and len(tab) == 359 and rep.excluded == 1 and rep.n_dropped == 0
    assert rep.exclude_file.endswith("contaminated_prompts.jsonl")
    assert tab.models == (WEAK, STRONG) and tab.binary_quality
    assert set(rep.layouts.values()) == {"routellm"}
    assert set(tab.eval_name) == {f"mmlu_{s}" for s in ("moral_scenarios", "conceptual_physics", "marketing",
                                                         "high_school_mathematics", "world_religions",
                                                         "professional_law")}
    # no responses in the table: prompt tokens + 1 output token (RouteLLM's max_new_tokens=1) x list prices
    assert (tab.cost_source == COST_SOURCES.index("price_table_default_output")).all()
    i = 0
    tokens = np.ceil(len(tab.prompt[i]) / 4.0)
    assert tab.cost[i, 1] == pytest.approx((tokens * 10.0 + 1 * 30.0) / 1e6)
    assert tab.cost[i, 0] == pytest.approx((tokens * 0.6 + 1 * 0.6) / 1e6)
    assert rep.cost_sources[STRONG] == {"price_table_default_output": 359}
    assert "OpenAI" in rep.price_sources[STRONG]
    # rows are data records: the moral_scenarios file's 8th record is the excluded one
    moral = tab.file == next(i for i, f in enumerate(tab.files) if "moral" in f)
    assert 8 not in tab.row[moral] and 9 in tab.row[moral]


def test_packaged_default_table_is_the_full_mmlu_table():
    tab, rep = import_benchmark(ImportConfig(), log=lambda s: None)
    assert DEFAULT_TABLE.is_dir() and (DEFAULT_TABLE / "NOTICE").is_file() and (DEFAULT_TABLE / "LICENSE").is_file()
    assert rep.rows_read == 14042 and rep.excluded == 5
    assert rep.dropped_rows == {"duplicate prompt: the first occurrence is kept": 105}
    assert len(tab) == 14042 - 5 - 105 and len(set(tab.prompt)) == len(tab)
    assert 0.6 < tab.quality[:, 0].mean() < 0.7 and 0.8 < tab.quality[:, 1].mean() < 0.85


def test_routerbench_wide_layout_costs_from_table_and_from_responses(tmp_path):
    models = ["m-small", "m-large", "m-mid"]
    df = pd.DataFrame({"sample_id": ["s1", "s2", "s3"], "prompt": ["2+2?", "capital of France?", "x" * 40],
                       "eval_name": ["math", "geo", "misc"], "oracle_model_to_route_to": ["m-small"] * 3})
    for k, m in enumerate(models):
        df[m] = [1.0, 0.5, 0.0]
        df[f"{m}|model_response"] = ["4", "Paris", "y" * 8 * (k + 1)]
        df[f"{m}|total_cost"] = [0.001 * (k + 1), 0.002 * (k + 1), np.nan]
    _write(tmp_path, "rb.csv", df)
    prices = tmp_path / "prices.yaml"
    prices.write_text("chars_per_token: 4\nmodels:\n" + "".join(
        f"  {m}: {{input_per_mtok: {k + 1}, output_per_mtok: {10 * (k + 1)}, source: test}}\n"
        for k, m in enumerate(models)))
    tab, rep = _imp(tmp_path / "rb.csv", price_table=prices)
    assert rep.layouts == {str(tmp_path / "rb.csv"): "routerbench"}
    assert tab.models == tuple(models) and list(tab.prompt_id) == ["s1", "s2", "s3"]
    assert list(tab.eval_name) == ["math", "geo", "misc"]
    assert tab.cost[1, 2] == pytest.approx(0.006)
    assert (tab.cost_source[:2] == 0).all()
    # the third prompt's costs come from the price table with the response length
    k = 1
    expected = (np.ceil(40 / 4) * (k + 1) + np.ceil(8 * (k + 1) / 4) * 10 * (k + 1)) / 1e6
    assert tab.cost[2, k] == pytest.approx(expected)
    assert tab.cost_source[2, k] == COST_SOURCES.index("price_table_tokens")
    assert rep.cost_sources["m-large"] == {"table": 2, "price_table_tokens": 1}


def test_long_layout_pivots_and_drops_incomplete_prompts_and_duplicate_pairs(tmp_path):
    df = pd.DataFrame({"prompt_id": ["a", "a", "b", "b", "c", "a"],
                       "model": ["m1", "m2", "m1", "m2", "m1", "m2"],
                       "quality": [1, 0, 0.5, 1, 1, 1], "cost": [0.1, 0.2, 0.1, 0.2, 0.1, 0.9]})
    _write(tmp_path, "long.csv", df)
    tab, rep = _imp(tmp_path / "long.csv", price_table=None)
    assert tab.models == ("m1", "m2") and list(tab.prompt_id) == ["a", "b"]
    assert tab.quality.tolist() == [[1.0, 0.0], [0.5, 1.0]] and tab.cost[0].tolist() == [0.1, 0.2]
    reasons = {(d.row, d.column): d.reason for d in rep.dropped}
    assert "duplicate (prompt_id, model)" in reasons[(6, "prompt_id")]
    assert reasons[(5, "model")] == "prompt lacks a row for some model"
    assert rep.n_dropped == 2


# ----------------------------------------------------------------------------- bad input
def test_non_numeric_quality_drops_the_row_naming_file_row_column_and_value(tmp_path):
    p = _write(tmp_path, "t.csv", _routellm([("multi\nline\nprompt", True, True), ("q2", "maybe", True),
                                             ("q3", False, True)]))
    tab, rep = _imp(tmp_path)
    assert list(tab.prompt) == ["multi\nline\nprompt", "q3"]
    (d,) = rep.dropped
    assert (d.file, d.row, d.column, d.reason, d.value) == (str(p), 2, WEAK, "quality is not a number", "'maybe'")
    with pytest.raises(BenchmarkImportError, match=r"t\.csv: row 2: column 'mistralai/Mixtral.*not a number.*maybe"):
        _imp(tmp_path, strict=True)


def test_negative_cost_drops_the_row(tmp_path):
    df = pd.DataFrame({"sample_id": ["s1", "s2"], "prompt": ["a", "b"], "m1": [1, 0], "m2": [0, 1],
                       "m1|total_cost": [0.1, -0.5], "m2|total_cost": [0.2, 0.2]})
    _write(tmp_path, "rb.csv", df)
    tab, rep = _imp(tmp_path)
    assert list(tab.prompt_id) == ["s1"]
    (d,) = rep.dropped
    assert (d.row, d.column, d.reason) == (2, "m1|total_cost", "cost is negative or infinite")
    with pytest.raises(BenchmarkImportError, match=r"rb\.csv: row 2: column 'm1\|total_cost': cost is negative"):
        _imp(tmp_path, strict=True)


def test_duplicate_prompts_keep_the_first_and_name_it(tmp_path):
    _write(tmp_path, "a.csv", _routellm([("same", True, True), ("other", False, True)]))
    b = _write(tmp_path, "b.csv", _routellm([("x", True, False), ("same", False, False)]))
    tab, rep = _imp(tmp_path)
    assert sorted(tab.prompt) == ["other", "same", "x"]
    assert tab.quality[list(tab.prompt).index("same")].tolist() == [1.0, 1.0]  # the first occurrence's
    (d,) = rep.dropped
    assert (d.file, d.row, d.column) == (str(b), 2, "prompt") and "a.csv row 1" in d.reason
    with pytest.raises(BenchmarkImportError, match=r"b\.csv: row 2: column 'prompt': duplicate prompt.*a\.csv row 1"):
        _imp(tmp_path, strict=True)


def test_missing_model_column_drops_the_file_and_extra_models_are_ignored(tmp_path):
    _write(tmp_path, "a.csv", _routellm([("p1", True, True), ("p2", False, True)]))
    c = _write(tmp_path, "c.csv", _routellm([("p3", True)], cols=("prompt", WEAK)))
    _write(tmp_path, "b.csv", pd.DataFrame({"prompt": ["p4"], WEAK: [True], STRONG: [False], "extra-model": [1]}))
    tab, rep = _imp(tmp_path)
    assert sorted(tab.prompt) == ["p1", "p2", "p4"] and tab.models == (WEAK, STRONG)
    (d,) = rep.dropped_files
    assert d.file == str(c) and d.column == STRONG and "missing" in d.reason
    assert rep.ignored_columns == [f"{tmp_path / 'b.csv'}: extra-model (model not in every file / not configured)"]
    with pytest.raises(BenchmarkImportError, match=rf"c\.csv: column '{STRONG}': model column"):
        _imp(tmp_path, strict=True)
    # configured models: a file without one of them is dropped even if it is the first
    tab, rep = _imp(tmp_path, models=(WEAK, "extra-model"), default_cost_per_call=0.001)
    assert list(tab.prompt) == ["p4"] and {Path(d.file).name for d in rep.dropped_files} == {"a.csv", "c.csv"}


def test_empty_files_are_dropped_and_all_empty_is_an_error(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header_only.csv").write_text(f"prompt,{WEAK},{STRONG}\n")
    with pytest.raises(BenchmarkImportError, match="no valid rows.*empty file"):
        _imp(tmp_path)
    _write(tmp_path, "ok.csv", _routellm([("p", True, False)]))
    tab, rep = _imp(tmp_path)
    assert len(tab) == 1 and sorted(Path(d.file).name for d in rep.dropped_files) == ["empty.csv", "header_only.csv"]
    assert all(d.reason == "empty file (no data rows)" for d in rep.dropped_files)
    with pytest.raises(BenchmarkImportError, match=r"empty\.csv: empty file"):
        _imp(tmp_path, strict=True)


def test_structural_problems_name_the_file_and_column(tmp_path):
    _write(tmp_path / "a", "x.csv", pd.DataFrame({"sample_id": ["s"], "prompt": ["p"], "m|total_cost": [0.1]}))
    with pytest.raises(BenchmarkImportError, match=r"x\.csv: column 'm': model 'm' has m\|\.\.\. columns but no qual"):
        _imp(tmp_path / "a", strict=True)
    _write(tmp_path / "b", "y.csv", pd.DataFrame({"question": ["p"], "score": [1]}))
    with pytest.raises(BenchmarkImportError, match=r"y\.csv: cannot tell the layout"):
        _imp(tmp_path / "b", strict=True)
    with pytest.raises(BenchmarkImportError, match="no such file or folder"):
        _imp(tmp_path / "missing")
    with pytest.raises(ValidationError, match=r"\nlayout\n  Input should be 'auto', 'routellm', 'routerbench' or "
                                              r"'long' .*'wide'"):
        ImportConfig(layout="wide")


def test_costs_need_a_price_or_a_default(tmp_path):
    _write(tmp_path, "t.csv", pd.DataFrame({"prompt": ["p1", "p2"], "m-a": [1, 0], "m-b": [0, 1]}))
    with pytest.raises(BenchmarkImportError, match="model 'm-a' has no cost in the table for 2 prompts and no price"):
        _imp(tmp_path)
    tab, rep = _imp(tmp_path, default_cost_per_call=0.002)
    assert (tab.cost == 0.002).all() and (tab.cost_source == COST_SOURCES.index("default_cost_per_call")).all()
    assert rep.price_sources["m-b"] == "default_cost_per_call = 0.002 USD"


def test_price_table_errors_name_the_field(tmp_path):
    p = tmp_path / "prices.yaml"
    p.write_text("models:\n  m: {input_per_mtok: -1}\n")
    with pytest.raises(ConfigError, match=r"prices\.yaml: models\.m\.input_per_mtok: must be >= 0"):
        PriceTable.load(p)
    p.write_text("models:\n  m: {input_per_mtok: 1, ouput_per_mtok: 2}\n")
    with pytest.raises(ConfigError, match=r"models\.m: unknown keys \['ouput_per_mtok'\]"):
        PriceTable.load(p)


def test_explicit_exclusion_list_must_exist_and_be_json_lines(tmp_path):
    shutil.copytree(SLICE, tmp_path / "t")
    with pytest.raises(BenchmarkImportError, match="exclusion list not found"):
        _imp(tmp_path / "t", exclude_prompts="nope.jsonl")
    (tmp_path / "t" / "bad.jsonl").write_text('{"eval_prompt": "a"}\nnot json\n')
    with pytest.raises(BenchmarkImportError, match=r"bad\.jsonl: row 2: not a JSON line"):
        _imp(tmp_path / "t", exclude_prompts="bad.jsonl")
    tab, rep = _imp(tmp_path / "t", exclude_prompts="")
    assert len(tab) == 360 and rep.excluded == 0


def test_configured_models_leave_other_columns_unvalidated(tmp_path):
    _write(tmp_path, "a.csv", pd.DataFrame({"prompt": ["p1", "p2"], WEAK: [True, False], STRONG: [True, True],
                                            "subject": ["algebra", "history"]}))
    tab, rep = _imp(tmp_path, models=(WEAK, STRONG))
    assert len(tab) == 2 and rep.n_dropped == 0
    assert rep.ignored_columns == [f"{tmp_path / 'a.csv'}: subject (model not in every file / not configured)"]
    # without the configuration the text column is read as a model, and every row has a bad quality
    with pytest.raises(BenchmarkImportError, match="no valid rows"):
        _imp(tmp_path)
    long = pd.DataFrame({"prompt_id": ["a", "a", "a"], "model": ["m1", "m2", "m3"], "quality": [1, 0, "x"],
                         "cost": [0.1, 0.2, 0.3]})
    _write(tmp_path / "long", "l.csv", long)
    tab, rep = _imp(tmp_path / "long", models=("m1", "m2"), price_table=None)
    assert tab.models == ("m1", "m2") and len(tab) == 1 and rep.n_dropped == 0


# ----------------------------------------------------------------------------- pandas index columns, quality scale
def _routerbench_frame(n: int = 6, models=("m-a", "m-b", "m-c")) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"sample_id": [f"mmlu.{i}" for i in range(n)], "prompt": [f"question {i}?" for i in range(n)],
                       "eval_name": ["mmlu"] * n})
    for k, m in enumerate(models):
        df[m] = rng.integers(0, 2, n).astype(float)
        df[f"{m}|model_response"] = ["A"] * n
        df[f"{m}|total_cost"] = 0.001 * (k + 1)
    df["oracle_model_to_route_to"] = models[0]
    return df


def test_files_written_by_to_csv_with_the_index_import_unmodified_in_both_layouts(tmp_path):
    rb = _routerbench_frame()
    rb.to_csv(tmp_path / "rb.csv")  # pandas' default: index=True, under an empty header
    tab, rep = _imp(tmp_path / "rb.csv", price_table=None)
    assert tab.models == ("m-a", "m-b", "m-c") and len(tab) == 6
    np.testing.assert_array_equal(tab.quality, rb[["m-a", "m-b", "m-c"]].to_numpy())
    assert rep.dropped_index_columns == [f"{tmp_path / 'rb.csv'}: column 1 '' (pandas index: row numbers 0..5)"]
    assert rep.to_dict()["dropped_index_columns"] == rep.dropped_index_columns

    rl = _routellm([("p1", True, False), ("p2", False, True), ("p3", True, True)])
    rl.index = [10, 20, 30]  # any index, not only 0..n-1
    rl.to_csv(tmp_path / "rl.csv")
    tab, rep = _imp(tmp_path / "rl.csv")
    assert tab.models == (WEAK, STRONG) and tab.quality.tolist() == [[1, 0], [0, 1], [1, 1]]
    assert rep.dropped_index_columns == [f"{tmp_path / 'rl.csv'}: column 1 '' (pandas index: int64 values 10, 20, "
                                         f"30)"]
    # a table that went through pandas twice: '' and 'Unnamed: 0'; a two-level index: two empty headers
    pd.read_csv(tmp_path / "rl.csv").to_csv(tmp_path / "twice.csv")
    rl2 = rl.copy()
    rl2.index = pd.MultiIndex.from_tuples([("mmlu", 1), ("mmlu", 2), ("gsm", 1)])
    rl2.to_csv(tmp_path / "multi.csv")
    for name in ("twice.csv", "multi.csv"):
        tab, rep = _imp(tmp_path / name)
        assert tab.models == (WEAK, STRONG) and len(tab) == 3 and len(rep.dropped_index_columns) == 2, name
    # Parquet keeps a non-range index as a column named by its pandas metadata
    rb.set_index("sample_id", drop=False).rename_axis("row").to_parquet(tmp_path / "rb.parquet")
    tab, rep = _imp(tmp_path / "rb.parquet", price_table=None)
    assert tab.models == ("m-a", "m-b", "m-c") and rep.dropped_index_columns[0].endswith(
        "column 14 'row' (pandas index: large_string values mmlu.0, mmlu.1, mmlu.2, ...)")
    # the long layout too
    long = pd.DataFrame({"prompt_id": ["a", "a", "b", "b"], "model": ["m1", "m2"] * 2, "quality": [1, 0, 0, 1],
                         "cost": [0.1, 0.2, 0.1, 0.2]})
    long.to_csv(tmp_path / "long.csv")
    tab, rep = _imp(tmp_path / "long.csv", price_table=None)
    assert tab.models == ("m1", "m2") and len(tab) == 2 and len(rep.dropped_index_columns) == 1


def test_quality_outside_the_declared_scale_is_refused_naming_file_row_and_column(tmp_path):
    rb = _routerbench_frame()
    rb.loc[3, "m-b"] = 1.5
    rb.to_csv(tmp_path / "rb.csv", index=False)
    for strict in (False, True):  # refused, not dropped: the table's scale or the cell is wrong
        with pytest.raises(BenchmarkImportError, match=r"rb\.csv: row 4: column 'm-b': quality 1\.5 is not in "
                                                       r"\[0, 1\] \(the routerbench layout's scale\)"):
            _imp(tmp_path / "rb.csv", price_table=None, strict=strict)
    # RouteLLM's correctness columns are binary
    _write(tmp_path / "rl", "t.csv", _routellm([("p1", 1, 0), ("p2", 0.5, 1)]))
    with pytest.raises(BenchmarkImportError, match=r"t\.csv: row 2: column 'mistralai.*quality 0\.5 is not 0 or 1"):
        _imp(tmp_path / "rl")
    # graded scores in the long layout: refused until the scale is declared
    long = pd.DataFrame({"prompt_id": ["a", "a", "b", "b"], "model": ["m1", "m2"] * 2, "quality": [1, 7, 9, 10],
                         "cost": [0.1, 0.2, 0.1, 0.2]})
    _write(tmp_path / "long", "l.csv", long)
    with pytest.raises(BenchmarkImportError, match=r"l\.csv: row 2: column 'quality': quality 7 is not in \[0, 1\]"
                                                   r".*declare it with quality_scale"):
        _imp(tmp_path / "long", price_table=None)
    tab, _ = _imp(tmp_path / "long", price_table=None, quality_scale="1..10")
    assert tab.quality.tolist() == [[1, 7], [9, 10]]
    with pytest.raises(BenchmarkImportError, match=r"l\.csv: row 1: .*quality 1 is not in \[2, 10\]"):
        _imp(tmp_path / "long", price_table=None, quality_scale="2..10")
    with pytest.raises(ValidationError, match=r"\nquality_scale\n  Value error, .*quality_scale must be 'auto', "
                                              r"'binary', 'unit' or 'LO\.\.HI' with finite LO < HI .*got '10\.\.1'"):
        ImportConfig(quality_scale="10..1")


def test_error_advice_never_leads_to_a_corrupted_table(tmp_path):
    """A named index column is not recognisable by its header: it fails the scale check, whose advice is to
    name the models (never a price or a scale for it); following the advice imports the right table."""
    rl = _routellm([(f"p{i}", i % 2 == 0, True) for i in range(5)]).rename_axis("idx")
    rl.to_csv(tmp_path / "t.csv")
    with pytest.raises(BenchmarkImportError) as err:
        _imp(tmp_path, default_cost_per_call=0.0)
    msg = str(err.value)
    assert "t.csv: row 3: column 'idx': quality 2 is not 0 or 1" in msg and "models option" in msg
    assert "default_cost_per_call" not in msg and "quality_scale" not in msg
    tab, rep = _imp(tmp_path, models=(WEAK, STRONG))
    assert tab.models == (WEAK, STRONG) and tab.quality[:, 0].tolist() == [1, 0, 1, 0, 1]
    assert any("idx" in c for c in rep.ignored_columns)
    # the case of the issue: an unnamed index and default_cost_per_call: 0 no longer makes a model ''
    rb = _routerbench_frame().drop(columns=[f"m-{c}|total_cost" for c in "abc"])
    rb.to_csv(tmp_path / "rb.csv")
    tab, _ = _imp(tmp_path / "rb.csv", price_table=None, default_cost_per_call=0.0)
    assert tab.models == ("m-a", "m-b", "m-c") and tab.quality.max() <= 1
    # the cost error's advice covers a column that is not a model without forcing a price on it
    with pytest.raises(BenchmarkImportError, match="if 'm-a' is not a model, list the table's models"):
        _imp(tmp_path / "rb.csv", price_table=None)


def test_json_lines_long_layout_as_judgement_records(tmp_path):
    """MT-Bench-style judgements: {question_id, model, score, turn, ...}, two turns per question."""
    import json

    recs = []
    for qid, scores in ((81, {"gpt-4": (9, 8), "mixtral": (6, 7)}), (82, {"gpt-4": (10, 10), "mixtral": (9, 8)})):
        for m, (t1, t2) in scores.items():
            for turn, sc in ((1, t1), (2, t2)):
                recs.append({"question_id": qid, "model": m, "judge": ["gpt-4", "single-v1"], "score": sc,
                             "turn": turn, "prompt": f"question {qid}", "tstamp": 1.7e9})
    lines = [json.dumps(r) for r in recs]
    lines.insert(3, "")  # blank lines are skipped, and line numbers still count them
    lines.insert(6, "{not json")
    p = tmp_path / "judgements.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchmarkImportError, match=r"judgements\.jsonl: row 1: column 'score': quality 9 is not in "
                                                   r"\[0, 1\]"):
        _imp(p, price_table=None, default_cost_per_call=0.01)
    # rows are line numbers: the first score of 10 is on line 6 (after a blank line)
    with pytest.raises(BenchmarkImportError, match=r"judgements\.jsonl: row 6: column 'score': quality 10 is not"):
        _imp(p, price_table=None, default_cost_per_call=0.01, quality_scale="1..9")
    tab, rep = _imp(p, price_table=None, default_cost_per_call=0.01, quality_scale="1..10")
    assert rep.layouts == {str(p): "long"} and tab.models == ("gpt-4", "mixtral")
    assert list(tab.prompt_id) == ["81", "82"] and list(tab.prompt) == ["question 81", "question 82"]
    assert tab.quality.tolist() == [[8.5, 6.5], [10.0, 8.5]]  # averaged over the two turns
    assert rep.aggregated and "averaged over turns for 2 prompts" in rep.aggregated[0]
    (d,) = rep.dropped
    assert (d.file, d.row, d.reason) == (str(p), 7, "not a JSON line (Expecting property name enclosed in double "
                                                    "quotes at character 1)")
    with pytest.raises(BenchmarkImportError, match=r"judgements\.jsonl: row 7: not a JSON line"):
        _imp(p, price_table=None, default_cost_per_call=0.01, quality_scale="1..10", strict=True)
    # a missing turn for one model: the question is dropped, naming its first line
    p.write_text("\n".join(json.dumps(r) for r in recs[:-1]) + "\n")
    tab, rep = _imp(p, price_table=None, default_cost_per_call=0.01, quality_scale="1..10")
    assert list(tab.prompt_id) == ["81"]
    assert rep.dropped_rows == {"models have different numbers of turns": 1} and rep.dropped[0].row == 5
    # the exclusion list next to a JSON-lines table is not read as a table
    (tmp_path / "contaminated_prompts.jsonl").write_text('{"eval_prompt": "question 82"}\n')
    tab, rep = _imp(tmp_path, price_table=None, default_cost_per_call=0.01, quality_scale="1..10")
    assert list(tab.prompt_id) == ["81"] and list(rep.layouts) == [str(p)]


# ----------------------------------------------------------------------------- bad input, round 3 (issue 36)
def _rb(ids, models=("m1", "m2"), cost=0.1) -> pd.DataFrame:
    """RouterBench's wide layout; models with no price in the packaged price table."""
    df = pd.DataFrame({"sample_id": ids, "prompt": [f"question {i}" for i in ids], "eval_name": ["e"] * len(ids)})
    for k, m in enumerate(models):
        df[m] = [float((i + k) % 2) for i in range(len(ids))]
        df[f"{m}|total_cost"] = cost * (k + 1)
    return df


def test_an_empty_cost_cell_drops_its_row_naming_the_files_cost_column(tmp_path):
    df = _rb(["s1", "s2", "s3"])
    df.loc[1, "m2|total_cost"] = np.nan
    p = _write(tmp_path, "rb.csv", df)
    tab, rep = _imp(p)  # the packaged price table has no price for m2: the cell cannot be filled
    assert list(tab.prompt_id) == ["s1", "s3"] and (tab.cost_source == 0).all()
    (d,) = rep.dropped
    assert (d.file, d.row, d.column) == (str(p), 2, "m2|total_cost") and d.reason.startswith("cost is missing")
    assert rep.n_dropped == 1 and rep.dropped_files == []
    with pytest.raises(BenchmarkImportError, match=r"rb\.csv: row 2: column 'm2\|total_cost': cost is missing.*"
                                                   r"no price.*default_cost_per_call.*strict=False"):
        _imp(p, strict=True)
    # a price (or a default) still fills the cell rather than dropping the row
    tab, rep = _imp(p, default_cost_per_call=0.5)
    assert len(tab) == 3 and tab.cost[1, 1] == 0.5 and rep.n_dropped == 0
    # the long layout names the record whose cost is missing (the prompt's second row, 'cost')
    long = pd.DataFrame({"prompt_id": ["a", "a", "b", "b"], "model": ["m1", "m2"] * 2, "quality": [1, 0, 0, 1],
                         "cost": [0.1, np.nan, 0.1, 0.2]})
    lp = _write(tmp_path / "long", "l.csv", long)
    tab, rep = _imp(lp, price_table=None)
    assert list(tab.prompt_id) == ["b"]
    assert [(d.file, d.row, d.column) for d in rep.dropped] == [(str(lp), 2, "cost")]
    with pytest.raises(BenchmarkImportError, match=r"l\.csv: row 2: column 'cost': cost is missing"):
        _imp(lp, price_table=None, strict=True)
    # no cost anywhere for a model without a price is still a configuration error (a price is missing)
    _write(tmp_path / "none", "n.csv", _rb(["s1", "s2"]).drop(columns=["m2|total_cost"]))
    with pytest.raises(BenchmarkImportError, match="model 'm2' has no cost in the table for 2 prompts and no price"):
        _imp(tmp_path / "none")


def test_a_file_with_no_cost_for_a_model_is_one_file_level_entry(tmp_path):
    _write(tmp_path, "a.csv", _rb([f"a{i}" for i in range(5)]))
    bad = _rb([f"b{i}" for i in range(60)])
    bad["m2|total_cost"] = np.nan
    b = _write(tmp_path, "b.csv", bad)
    tab, rep = _imp(tmp_path)
    assert len(tab) == 5 and rep.dropped == [] and rep.n_dropped == 0
    (d,) = rep.dropped_files
    assert (d.file, d.row, d.column) == (str(b), None, "m2|total_cost") and "model 'm2' has no cost" in d.reason
    with pytest.raises(BenchmarkImportError, match=r"b\.csv: column 'm2\|total_cost': model 'm2' has no cost"):
        _imp(tmp_path, strict=True)


def test_messages_name_the_files_own_id_column(tmp_path):
    df = _rb(["s1", "s2", "s1"])
    p = _write(tmp_path, "rb.csv", df)
    tab, rep = _imp(p, default_cost_per_call=0.0)
    assert list(tab.prompt_id) == ["s1", "s2"]
    (d,) = rep.dropped
    assert (d.file, d.row, d.column) == (str(p), 3, "sample_id") and "rb.csv row 1" in d.reason
    with pytest.raises(BenchmarkImportError, match=r"rb\.csv: row 3: column 'sample_id': duplicate prompt"):
        _imp(p, default_cost_per_call=0.0, strict=True)
    # judgement tables name the id question_id: a question repeated in a second file is reported under it
    for name, qids in (("j1.csv", [81, 82]), ("j2.csv", [83, 81])):
        _write(tmp_path / "j", name, pd.DataFrame({"question_id": np.repeat(qids, 2), "model": ["a", "b"] * 2,
                                                   "score": [1, 0, 0, 1]}))
    tab, rep = _imp(tmp_path / "j", price_table=None, default_cost_per_call=0.0)
    assert sorted(tab.prompt_id) == ["81", "82", "83"]
    (d,) = rep.dropped
    assert (Path(d.file).name, d.row, d.column) == ("j2.csv", 3, "question_id")
    # the RouteLLM layout has no id: its duplicates are named by the prompt column (unchanged)
    _write(tmp_path / "r", "r.csv", _routellm([("same", True, True), ("same", False, True)]))
    _, rep = _imp(tmp_path / "r")
    assert [d.column for d in rep.dropped] == ["prompt"]


def test_a_model_column_empty_in_one_file_is_one_file_level_entry(tmp_path):
    """RouteLLM's per-subject CSVs: one subject file whose strong-model column is all empty. The file is
    dropped with one entry: its prompts cannot have every model's quality, and dropping the model from the
    whole table instead would lose far more good cells (the entry says how to choose that instead)."""
    shutil.copytree(SLICE, tmp_path / "t")
    f = tmp_path / "t" / "mmlu_marketing.csv"
    df = pd.read_csv(f)
    df[STRONG] = np.nan
    df.to_csv(f, index=False)
    tab, rep = _imp(tmp_path / "t")
    assert rep.dropped == [] and rep.n_dropped == 0 and not (tab.eval_name == "mmlu_marketing").any()
    (d,) = rep.dropped_files
    assert (d.file, d.row, d.column) == (str(f), None, STRONG)
    assert f"model '{STRONG}' has no values in this file (all {len(df)} rows empty)" in d.reason
    assert "leave" in d.reason and "models option" in d.reason
    with pytest.raises(BenchmarkImportError, match=rf"mmlu_marketing\.csv: column '{STRONG}': model '{STRONG}' has "
                                                   r"no values in this file.*strict=False"):
        _imp(tmp_path / "t", strict=True)
    # the same in the long layout: one entry, not one per record and one per prompt
    long = pd.DataFrame({"prompt_id": np.repeat(["a", "b", "c"], 2), "model": ["m1", "m2"] * 3,
                         "quality": [1, np.nan, 0, np.nan, 1, np.nan], "cost": 0.1})
    _write(tmp_path / "long", "a.csv", long.assign(quality=[1, 0, 0, 1, 1, 1], prompt_id=list("xxyyzz")))
    lb = _write(tmp_path / "long", "b.csv", long)
    tab, rep = _imp(tmp_path / "long", price_table=None)
    assert len(tab) == 3 and rep.dropped == []
    (d,) = rep.dropped_files
    assert (d.file, d.column) == (str(lb), "quality") and "model 'm2' has no values in this file" in d.reason
