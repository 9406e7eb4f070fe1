"""External suites (issue 15): the importers, the type-preserving codec, and the judge outside
the candidate's process, against the real Docker sandbox: every canonical solution of the
project's HumanEval-style and MBPP-style samples passes, `return None` variants and every
forger fail, a failing canonical solution is reported and excluded."""

from __future__ import annotations

import gzip
import json
import math
import pickle

import pytest

from sage_pipeline.sim import runner
from sage_pipeline.sim.sandbox import open_sandbox
from sage_pipeline.sim.schema import ExecJob
from sage_pipeline.sim.suites import (
    FORGERS,
    SAMPLE_FILES,
    SuiteFileError,
    broken,
    forger,
    read_suite,
    verify_suite,
)

# -- the codec ---------------------------------------------------------------------------------

VALUES = [
    None, True, False, 0, -1, 2 ** 53, -(2 ** 53) - 1, 10 ** 400, -(7 ** 900), 1.5, -0.0, 1e308,
    float("inf"), float("-inf"), "", "é\x00\n", b"", b"\x00\xff", bytearray(b"ab"), complex(1.5, -2.0),
    [], [1, [2, [3]]], (), (1,), (1, (2, "x")), set(), {1, 2, 3}, frozenset({(1, 2)}), {}, {1: "a", "1": 1},
    {(1, 2): {3: [4.0, None]}}, [(True, 1), {False: b"x"}],
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_the_codec_round_trips_types_exactly(value):
    back = runner.loads_value(runner.dumps_value(value))
    assert type(back) is type(value)
    assert back == value or (isinstance(value, float) and math.isnan(value))

    def types(v):
        if isinstance(v, (list, tuple, set, frozenset)):
            return (type(v), sorted((types(x) for x in v), key=repr))
        if isinstance(v, dict):
            return (dict, sorted(((types(k), types(x)) for k, x in v.items()), key=repr))
        return type(v)

    assert types(back) == types(value)  # a tuple inside a list stays a tuple, True stays a bool


def test_nan_round_trips():
    assert math.isnan(runner.loads_value(runner.dumps_value(float("nan"))))


def test_subclasses_travel_as_their_plain_value():
    import collections

    assert runner.loads_value(runner.dumps_value(collections.Counter("aab"))) == {"a": 2, "b": 1}
    P = collections.namedtuple("P", "x y")
    back = runner.loads_value(runner.dumps_value(P(1, 2)))
    assert back == (1, 2) and type(back) is tuple


@pytest.mark.parametrize("text", [
    pickle.dumps([1, 2]).hex(), "{\"x\": 1}", "{\"i\": 5}", "{\"s\": [[1]]}", "{\"d\": [[1]]}", "{\"b\": \"@@\"}",
    "{\"f\": \"1.5\"}", "[" * 5000 + "]" * 5000, "{\"t\": 1}", "{\"c\": [1, 2]}", "NaN-ish", "",
])
def test_the_decoder_refuses_anything_it_did_not_make(text):
    with pytest.raises(runner.CodecError):
        runner.loads_value(text)


def test_objects_do_not_encode():
    class Anything:
        def __eq__(self, other):
            return True

    with pytest.raises(runner.CodecError, match="Anything cannot cross"):
        runner.dumps_value([Anything()])


# -- the importers -------------------------------------------------------------------------------

def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _he(**over):
    d = json.loads(SAMPLE_FILES["humaneval"].read_text().splitlines()[0])
    d.update(over)
    return d


def _mbpp(**over):
    d = json.loads(SAMPLE_FILES["mbpp"].read_text().splitlines()[0])
    d.update(over)
    return d


def test_the_samples_import_in_both_formats_and_gzipped(tmp_path):
    he, mb = read_suite(SAMPLE_FILES["humaneval"]), read_suite(SAMPLE_FILES["mbpp"])
    assert len(he) >= 8 and len(mb) >= 8
    assert {p.suite for p in he} == {"humaneval"} and {p.suite for p in mb} == {"mbpp"}
    assert he[0].checks == ["check(candidate)"] and "def check(candidate)" in he[0].setup
    assert mb[0].entry_point == "similar_elements" and len(mb[0].checks) == 3
    gz = tmp_path / "HumanEval.jsonl.gz"
    gz.write_bytes(gzip.compress(SAMPLE_FILES["humaneval"].read_bytes()))
    assert [p.task_id for p in read_suite(gz)] == [p.task_id for p in he]


@pytest.mark.parametrize("record, line, field", [
    (_he(entry_point=None), 2, "'entry_point' is null"),
    ({k: v for k, v in _he().items() if k != "test"}, 2, "field 'test' is missing"),
    (_he(test="def test(c):\n    pass\n"), 2, "defines no `def check(candidate)`"),
    (_he(test="def check(candidate):\n    assert (\n"), 2, "field 'test' is not valid Python"),
    (_he(entry_point="not a name"), 2, "'entry_point' is 'not a name'"),
    ('{"task_id": "x", "prompt": ', 2, "not a JSON line"),
    ("[1, 2]", 2, "must be a JSON object"),
])
def test_a_malformed_humaneval_problem_names_file_line_and_field(tmp_path, record, line, field):
    path = _write(tmp_path / "he.jsonl", [_he(task_id="ok/0"), record])
    with pytest.raises(SuiteFileError) as e:
        read_suite(path)
    assert str(e.value).startswith(f"{path}:{line}:") and field in str(e.value)


@pytest.mark.parametrize("record, field", [
    (_mbpp(test_list="assert f(1) == 1"), "field 'test_list' is \"assert"),
    (_mbpp(test_list=["print(1)"]), "field 'test_list[0]' is 'print(1)', expected an assert"),
    (_mbpp(test_list=[]), "field 'test_list' is empty"),
    (_mbpp(code="def other(x):\n    return x\n"), "none of which field 'code' defines"),
    ({k: v for k, v in _mbpp().items() if k != "test_setup_code"}, "field 'test_setup_code' is missing"),
    (_mbpp(challenge_test_list=[3]), "field 'challenge_test_list[0]' is 3"),
])
def test_a_malformed_mbpp_problem_names_file_line_and_field(tmp_path, record, field):
    path = _write(tmp_path / "mbpp.jsonl", [_mbpp(task_id=100), record])
    with pytest.raises(SuiteFileError) as e:
        read_suite(path)
    assert str(e.value).startswith(f"{path}:2:") and field in str(e.value), str(e.value)


def test_a_repeated_task_id_and_a_missing_file_are_errors(tmp_path):
    path = _write(tmp_path / "he.jsonl", [_he(), _he()])
    with pytest.raises(SuiteFileError, match=r":2: field 'task_id' .* repeats the problem of line 1"):
        read_suite(path)
    with pytest.raises(SuiteFileError, match="no such suite file"):
        read_suite(tmp_path / "missing.jsonl")
    bad_gz = tmp_path / "bad.jsonl.gz"
    bad_gz.write_bytes(gzip.compress(SAMPLE_FILES["humaneval"].read_bytes())[:-6])  # truncated
    with pytest.raises(SuiteFileError, match="cannot be read as gzip"):
        read_suite(bad_gz)


def _sanitized(d: dict, **over) -> dict:
    """A full-release MBPP record in the sanitized release's shape (sanitized-mbpp.json):
    prompt instead of text, test_imports, source_file, no test_setup_code nor challenge list."""
    out = {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": d["task_id"],
           "prompt": d["text"], "code": d["code"], "test_imports": [], "test_list": d["test_list"]}
    out.update(over)
    return out


def test_the_sanitized_mbpp_release_imports_as_a_json_array_and_as_jsonl(tmp_path):
    full = [json.loads(line) for line in SAMPLE_FILES["mbpp"].read_text().splitlines() if line.strip()]
    array = tmp_path / "sanitized-mbpp.json"
    array.write_text(json.dumps([_sanitized(d) for d in full], indent=4))  # as the authors ship it
    got, want = read_suite(array), read_suite(SAMPLE_FILES["mbpp"])
    assert [(p.task_id, p.entry_point, p.checks, p.prompt) for p in got] == \
           [(p.task_id, p.entry_point, p.checks, p.prompt) for p in want]
    lines = _write(tmp_path / "sanitized.jsonl", [_sanitized(full[0], test_imports=["import math"])])
    (p,) = read_suite(lines)
    assert p.setup == "import math" and p.entry_point == full[0]["code"].split("(")[0].split()[-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([_sanitized(full[0]), _sanitized(full[1], test_imports="import math")]))
    with pytest.raises(SuiteFileError, match=r"bad.json: problem \[1\]: field 'test_imports' is \"import math\""):
        read_suite(bad)
    bad.write_text(json.dumps([{k: v for k, v in _sanitized(full[0]).items() if k != "code"}]))
    with pytest.raises(SuiteFileError, match=r"problem \[0\]: field 'code' is missing \(a sanitized MBPP"):
        read_suite(bad)
    bad.write_text('[{"task_id": 1,')
    with pytest.raises(SuiteFileError, match="starts with '\\[' but is not a JSON array"):
        read_suite(bad)


# -- the judge outside the candidate, in the real Docker sandbox ------------------------------------

@pytest.fixture(scope="module")
def suite_sandbox(docker_ready):
    with open_sandbox("docker", workers=2, untrusted=True) as sb:
        yield sb


@pytest.mark.parametrize("fmt", ["humaneval", "mbpp"])
def test_canonical_solutions_pass_and_broken_variants_fail(suite_sandbox, fmt):
    problems = read_suite(SAMPLE_FILES[fmt])
    report = verify_suite(problems, suite_sandbox.run)
    assert report.excluded == [] and len(report.kept) == len(problems)
    results = suite_sandbox.run([p.job(broken(p), report.timeouts[p.task_id]) for p in problems])
    assert [r.outcome for r in results] == ["wrong_answer"] * len(problems), results


@pytest.mark.parametrize("name", sorted(FORGERS))
@pytest.mark.parametrize("fmt", ["humaneval", "mbpp"])
def test_no_forger_passes(suite_sandbox, fmt, name):
    problems = read_suite(SAMPLE_FILES[fmt])
    results = suite_sandbox.run([p.job(forger(name, p), 3.0) for p in problems])
    assert [r for r in results if r.passed or r.tests_passed] == []
    # the next normal task in the same warm containers is judged correctly
    assert all(r.passed for r in suite_sandbox.run([p.job(p.canonical, 5.0) for p in problems]))


def test_a_sanitized_mbpp_problem_runs_its_test_imports_in_the_judge(suite_sandbox, tmp_path):
    d = _sanitized(_mbpp(), test_list=["assert math.prod(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == 20"],
                   test_imports=["import math"])
    (p,) = read_suite(_write(tmp_path / "sanitized.jsonl", [d]))
    assert verify_suite([p], suite_sandbox.run).kept == [p.task_id]
    assert suite_sandbox.run([p.job(broken(p), 5.0)])[0].outcome == "wrong_answer"


def test_a_failing_canonical_solution_is_reported_and_excluded(suite_sandbox, tmp_path):
    good = _he(task_id="ok/0")
    bad = _he(task_id="bad/1", canonical_solution="    return (max(numbers), min(numbers)) if numbers else None\n")
    path = _write(tmp_path / "he.jsonl", [good, bad])
    report = verify_suite(read_suite(path), suite_sandbox.run)
    assert report.kept == ["ok/0"]
    assert report.excluded == [{"task_id": "bad/1", "outcome": "wrong_answer",
                                "why": report.excluded[0]["why"], "source": f"{path}:2"}]
    assert "AssertionError" in report.excluded[0]["why"]


def test_the_checks_run_unchanged_in_the_judge(suite_sandbox):
    # tolerance checks, random inputs, a helper the prompt defines, identity of True/None,
    # exceptions of the candidate re-raised in the judge as their own type
    setup = ("import math, random\n"
             "def helper(x):\n    return x * 2\n"
             "def check(candidate):\n"
             "    rng = random.Random(1)\n"
             "    for _ in range(200):\n"
             "        x = rng.uniform(-5, 5)\n"
             "        assert abs(candidate(helper(x)) - x) < 1e-9\n"
             "    assert candidate(0.0) == 0.0 and candidate(float('inf')) == math.inf\n"
             "    try:\n"
             "        candidate('boom')\n"
             "    except TypeError:\n"
             "        pass\n"
             "    else:\n"
             "        raise AssertionError('a TypeError was expected')\n")
    tests = [{"check": "check(candidate)", "setup": setup}]
    ok = ExecJob("def half(y):\n    return y / 2\n", "half", tests, 5.0)
    wrong = ExecJob("def half(y):\n    return y / 2 + 1e-6\n", "half", tests, 5.0)
    assert [r.outcome for r in suite_sandbox.run([ok, wrong])] == ["pass", "wrong_answer"]


def test_the_judge_runs_as_another_uid_than_the_candidate(suite_sandbox):
    tests = [{"check": "import os\nassert os.getuid() == 65533\nassert candidate() == 65534", "setup": ""}]
    job = ExecJob("import os\ndef whoami():\n    return os.getuid()\n", "whoami", tests, 3.0)
    assert suite_sandbox.run([job])[0].outcome == "pass"


def test_a_hanging_candidate_is_a_timeout_and_the_next_job_is_judged(suite_sandbox):
    p = read_suite(SAMPLE_FILES["mbpp"])[0]
    hang = p.job(f"def {p.entry_point}(*a):\n    while True:\n        pass\n", 1.0)
    daemon = p.job(f"import os, time\ndef {p.entry_point}(*a):\n    if os.fork() == 0:\n        os.setsid()\n"
                   "        while True:\n            time.sleep(0.01)\n    return None\n", 2.0)
    r_hang, r_daemon, r_ok = suite_sandbox.run([hang, daemon, p.job(p.canonical, 5.0)])
    assert r_hang.outcome == "timeout" and 1.0 <= r_hang.runtime_s < 4.0, r_hang
    assert r_daemon.outcome == "wrong_answer", r_daemon
    assert r_ok.outcome == "pass", r_ok
