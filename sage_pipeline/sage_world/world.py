"""The model world: what every LLM that SAGE's ``sage run`` calls would answer, drawn from the
project's verified coding tasks with the calibrated chances of ``sim/data/sage_loop.yaml``, and
the exact expected outcome of each routed call (pure: no HTTP, no dagster).

SAGE's agents are told apart by their user message (SAGE's own templates: ``planner.py:626``,
``coder.py:414``, ``debugger.py:406``, ``reviewer.py:477``, ``test_engineer.py:170``,
``documentation.py:131``, ``architect.py:152``). The harness starts each ``sage run`` with a goal
that names the run (``[sage-world run=<id>]``); the world's planner copies that mark into the one
coder task it plans, so every later agent's prompt names the run and the world knows the task.

What each agent gets back (SAGE's parsers accept exactly these shapes):

* **planner**: one coder task writing ``<module>.py`` (a root-level module, so SAGE's reviewer
  calls its model) with ``verification: python -m pytest -q tests/test_<module>.py``. Its content
  does not depend on the planner's model (an assumption: no published planning figure).
* **coder** (model chosen by SAGE's UCB bandit): the task's reference solution with the
  calibrated first-attempt chance of that model (``SageLoopSim.p_code``; moved by
  ``WorldConfig.coder_shift`` where a test harness sets one: :meth:`ModelWorld.p_coder`), else one of
  the task's verified wrong candidates, uniformly.
* **reviewer**: the right verdict with probability ``0.5 + 0.5 * p_code(reviewer model)`` (an
  assumption: a model that would write the solution recognises a right or wrong one; otherwise
  it guesses). PASS scores ``review_pass_score``, FAIL ``review_fail_score``.
* **test_engineer**: the task's own verified tests as ``tests/test_<module>.py`` (guarded by a
  time and memory limit), so SAGE's verification command really runs the candidate; written in one of
  the styles models write (``WorldConfig.test_styles``, drawn per task by the seed: pytest fixtures,
  raises, parametrize, a test class, tmp_path, monkeypatch, approx, unittest, plain asserts, and
  FastAPI's ``TestClient`` on an app the test builds around the function when asked:
  :data:`DEFAULT_TEST_STYLES` says why not by default; :func:`verified_tests`), each checking every
  case exactly as the plain one does. The world has no web-app task family: the ``TestClient`` style
  serves the task's function over HTTP.
* **debugger**: a wrong file is repaired with the calibrated chance of that model for that wrong
  candidate (``SageLoopSim.p_debug``: its outcome kind and share of tests passed); a failed
  repair leaves it as it was. A right file (a reviewer's false FAIL) stays right.
* documentation and architect (never planned by the world): a valid minimal answer.

Draws are seeded by (seed, run, agent, call number): the same seed gives the same world whatever
order concurrent runs reach the server in.

**Time and money.** Each call costs the GPU-seconds of ``sim/data/model_time.yaml``
(:class:`ModelTimeConfig`): ``prompt_tokens(agent) / prefill_tokens_per_s(model) +
completion_tokens(agent) / decode_tokens_per_s(model)`` on an RTX 4090, the throughputs scaled from
a published llama.cpp measurement by parameter count, the tokens a typical call of each SAGE agent
(:meth:`ModelWorld.call_seconds`: a function of (agent, model) alone, so the truth evaluates it
exactly). An API model uses no GPU; its dollars are its list price in ``sage_loop.yaml`` times the
same tokens (:meth:`ModelWorld.call_usd`; 0 for a local model, whose cost is its time). **The
clock:** the server sleeps ``WorldConfig.clock_scale x call_seconds`` wall seconds before it
answers (default 0.1: a tenth of the GPU time; 0: at once), holding no lock, so concurrent runs
wait in parallel as on a GPU that serves each at full speed. SAGE's journals carry it: SAGE writes
an ``AGENT_INSIGHT_EMITTED`` "decision" naming the model just before each call and its next line
after the answer, so that gap / clock_scale is the call's GPU-seconds plus SAGE's own overhead
/ clock_scale (measured in ``sage_pipeline_tests/sage_world/test_world_clock.py``). SAGE writes
no ``TOKEN_USAGE`` against Ollama (server.py), so the routing dataset's ``latency_s``, read before a
``TOKEN_USAGE``, stays empty for the world's journals.

**Skills** (a test harness, off by default: ``ModelWorld(..., skills=SkillsWorldConfig(...))``, never part
of the Dagster job's config; :mod:`.skills_world`): in ``null``
mode each call's truth record lists the skills SAGE injected into its prompt; in ``planted`` mode a stated
instruction among them moves one role's chance by a stated delta (:meth:`ModelWorld.chance`), and the
world answers the sleep cycle's reflect requests. Off, the world never reads a prompt's skills.

**Truth.** Every call the world answers is recorded (never in SAGE's journals): the run, the task,
the agent, the model, the file before and after, and the chance of a right file under each model
of the role's row in SAGE's table. From these chances and SAGE's control flow,
:mod:`sage_pipeline.sage_world.truth` gives the exact value of any policy SAGE's router can serve.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sage_world.skills_world import SkillsWorld, SkillsWorldConfig
from sage_pipeline.sim.loop_config import (
    DEFAULT_CONFIG,
    Assumed,
    Row,
    SageLoopConfig,
    SageLoopConfigError,
    Source,
    Text,
)
from sage_pipeline.sim.loop_env import SageLoopSim
from sage_pipeline.sim.schema import OUTCOME_KINDS, TaskRecord

AGENTS = ("planner", "coder", "debugger", "reviewer", "test_engineer", "documentation", "architect")
# SAGE's user-message templates, by agent (the first words SAGE writes).
_PREFIX = (("Generate a Task DAG for the following goal.", "planner"),
           ("Implement the following task.", "coder"),
           ("Fix the following error.", "debugger"),
           ("Review this file for task: ", "reviewer"),
           ("Generate pytest tests for ", "test_engineer"),
           ("Produce the markdown PatchRequest for ", "documentation"),
           ("Design the project blueprint for:", "architect"))
RUN_MARK = re.compile(r"\[sage-world run=(?P<run>[A-Za-z0-9_.:-]+)\]")
MAX_RETRIES = 5  # `sage run`'s max_retries (cli/run_cmd.py:165): at most five debugger calls per task


class WorldError(ValueError):
    """A request the world cannot answer; the message says what was wrong."""


class WorldConfig(BaseModel):
    """The model world's settings (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(0, description="seeds every draw: the same seed gives the same world")
    aliases: dict[str, str] = Field(
        default_factory=lambda: {"qwen2.5-coder:14b-instruct-q4_K_M": "qwen2.5-coder:14b"},
        description="SAGE's Ollama tag -> the calibrated model it is (Ollama's qwen2.5-coder:14b is the "
                    "14b-instruct-q4_K_M build; Aider's row for it names that tag)")
    review_pass_score: float = Field(0.9, ge=0.5, le=1.0, description="the reviewer's score with a PASS verdict")
    review_fail_score: float = Field(0.3, ge=0.0, lt=0.5, description="the reviewer's score with a FAIL verdict")
    chars_per_token: float = Field(4.0, gt=0, description="tokens reported = characters / this")
    adopt_unmarked: bool = Field(False, description="a planner goal without a run mark (SAGE's own `sage bench` "
                                 "prompts) becomes a run of a task chosen by a hash of the goal; off, it is refused")
    clock_scale: float = Field(0.1, ge=0.0, le=10.0,
                               description="wall seconds the server sleeps per calibrated GPU-second of a call "
                                           "(ModelWorld.call_seconds) before it answers; 0 answers at once")
    test_styles: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TEST_STYLES), min_length=1,
        description="the styles the test engineer writes a task's verified cases in, one drawn per task by the seed "
                    "(style_for; TEST_STYLES): pytest fixtures, raises, parametrize, classes, tmp_path, "
                    "monkeypatch, approx, unittest, plain asserts; 'testclient' (FastAPI's TestClient) only when "
                    "SAGE's gate runs a Python with FastAPI (DEFAULT_TEST_STYLES says why it is not by default)")

    coder_shift: dict[str, float] = Field(
        default_factory=dict,
        description="a test harness's knob, empty by default (the calibration as it is): model -> a number added to "
                    "the coder's chance of a right first file with that model (ModelWorld.p_coder; clipped to [0, 1]), "
                    "to set a coder gap or inject a drift (benchmarks/decision_e2e.py). A model is named as SAGE's "
                    "table names it or by its calibrated name; the reviewer's accuracy and the debugger's repairs "
                    "keep the calibration's figures")

    @field_validator("coder_shift")
    @classmethod
    def _shifts(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not (-1.0 <= float(x) <= 1.0)}
        if bad:
            raise ValueError(f"coder_shift {bad}: a chance moves by at most 1 either way")
        return v

    @field_validator("test_styles")
    @classmethod
    def _known_styles(cls, v: list[str]) -> list[str]:
        unknown = [x for x in v if x not in TEST_STYLES]
        if unknown:
            raise ValueError(f"unknown test styles {unknown}: the world writes {', '.join(TEST_STYLES)}")
        return v


DEFAULT_MODEL_TIME = DEFAULT_CONFIG.with_name("model_time.yaml")


class _TimePart(BaseModel):
    """A mapping of the model-time file: exactly its keys, numbers as numbers, finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class Published(_TimePart):
    """A published positive figure and where it comes from."""

    value: float = Field(gt=0.0, description="the figure")
    source: Text = Field(description="its source: a key of `sources`")
    row: Row = Field("", description="the table row it comes from")


class Gpu(_TimePart):
    """The GPU every local model runs on, and the measurement the models' throughputs scale from."""

    name: Text = Field(description="the GPU and the runtime")
    anchor_model: Text = Field(description="the model the throughputs were measured with")
    anchor_params_b: Published = Field(description="its parameters, in billions")
    decode_tokens_per_s: Published = Field(description="its generation speed (tokens/s)")
    prefill_tokens_per_s: Published = Field(description="its prompt-processing speed (tokens/s)")


class TimedModel(_TimePart):
    """One model of SAGE's table: a local one's parameters (published), or an API model."""

    params_b: float | None = Field(None, gt=0.0, description="billions of parameters (a local model)")
    source: Text | None = Field(None, description="where params_b comes from: a key of `sources`")
    api: bool = Field(False, description="a hosted model: no GPU time; priced by sage_loop.yaml's `price`")

    @model_validator(mode="after")
    def _local_or_api(self) -> TimedModel:
        if self.api != (self.params_b is None) or (self.params_b is None) != (self.source is None):
            raise ValueError("a model is either `api: true` alone, or `params_b` with its `source`")
        return self


class CallTokens(_TimePart):
    prompt: float = Field(ge=0.0, description="tokens SAGE sends")
    completion: float = Field(ge=0.0, description="tokens the model answers")


def _every_agent(v: dict[str, CallTokens]) -> dict[str, CallTokens]:
    if set(v) != set(AGENTS):
        raise ValueError(f"needs exactly the keys {list(AGENTS)}, got {sorted(v)}")
    return v


class TimeAssumptions(_TimePart):
    throughput_scaling: Assumed[Literal["parameters"]] = Field(description="how a model's tokens/s follow from "
                                                                "the anchor's")
    call_tokens: Assumed[dict[str, CallTokens]] = Field(description="tokens of one call, per SAGE agent")

    @field_validator("call_tokens")
    @classmethod
    def _agents(cls, v: Assumed) -> Assumed:
        _every_agent(v.value)
        return v


class ModelTimeConfig(_TimePart):
    """The GPU time of one call of each model of SAGE's table (``sim/data/model_time.yaml``):
    ``seconds(agent, model) = prompt / prefill_tokens_per_s + completion / decode_tokens_per_s``,
    a model's throughput the anchor's x ``anchor_params_b / params_b``; 0 for an API model."""

    version: Literal[1] = Field(1, description="the file format's version")
    sources: dict[str, Source] = Field(description="the publications the figures come from, by id")
    gpu: Gpu = Field(description="the GPU and the anchor measurement")
    models: dict[str, TimedModel] = Field(description="every model of SAGE's table, by name")
    assumptions: TimeAssumptions = Field(description="every figure nothing published gives, with its reason")

    _source: str = PrivateAttr("<memory>")

    @model_validator(mode="after")
    def _sources_exist(self) -> ModelTimeConfig:
        refs = [(f"gpu.{k}.source", getattr(self.gpu, k).source)
                for k in ("anchor_params_b", "decode_tokens_per_s", "prefill_tokens_per_s")]
        refs += [(f"models.{n}.source", m.source) for n, m in self.models.items() if m.source is not None]
        for where, src in refs:
            if src not in self.sources:
                raise PydanticCustomError("model_time", "{problem}", {
                    "where": where, "problem": f"{src!r} is not one of the file's sources {sorted(self.sources)} "
                                               "(every published figure names its source)"})
        return self

    @property
    def source(self) -> str:
        return self._source

    def tokens_per_s(self, model: str) -> tuple[float, float]:
        """(prefill, decode) tokens/s of local ``model`` on the file's GPU."""
        g, m = self.gpu, self.models[model]
        scale = g.anchor_params_b.value / float(m.params_b)
        return g.prefill_tokens_per_s.value * scale, g.decode_tokens_per_s.value * scale

    def split(self, agent: str, model: str) -> tuple[float, float]:
        """(prompt-processing, generation) GPU-seconds of one call of ``agent`` to ``model`` (a name
        of the file's ``models``); (0, 0) for an API model."""
        if self.models[model].api:
            return 0.0, 0.0
        tok = self.assumptions.call_tokens.value[agent]
        prefill, decode = self.tokens_per_s(model)
        return tok.prompt / prefill, tok.completion / decode

    @classmethod
    def load(cls, path: str | Path = DEFAULT_MODEL_TIME) -> ModelTimeConfig:
        """The file at ``path``; a bad one raises SageLoopConfigError naming the file and the field."""
        path = Path(path)
        if not path.is_file():
            raise SageLoopConfigError(path, "<file>", "model-time file not found",
                                      f"pass the path of a file shaped like {DEFAULT_MODEL_TIME}")
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            cfg = cls.model_validate(doc)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise SageLoopConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
        except ValidationError as exc:
            e = exc.errors()[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".") or "<document>"
            if e["type"] == "model_time":
                where = e["ctx"]["where"]
            raise SageLoopConfigError(path, where, e["msg"].removeprefix("Value error, ")) from None
        cfg._source = str(path)
        return cfg


def agent_of(messages: Sequence[dict]) -> str:
    """Which SAGE agent sent ``messages`` (its user message's template), or WorldError."""
    user = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), None)
    if user is None:
        raise WorldError("chat request without a user message: SAGE's agents always send one")
    for prefix, agent in _PREFIX:
        if user.startswith(prefix):
            return agent
    raise WorldError(f"no SAGE agent writes a user message starting {user[:60]!r}")


def module_of(task: TaskRecord) -> str:
    """The module the world's plan writes the task's function into: one per task (tasks of a family
    share their function's name, and runs in one SAGE workspace share its files), never a stdlib name."""
    return "sol_" + re.sub(r"\W", "_", task.task_id)


def _draw(seed: int, *key: object) -> np.random.Generator:
    digest = hashlib.sha256(json.dumps([seed, *map(str, key)]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


@dataclass
class _Run:
    """What the world knows about one `sage run`: its task, the file it wrote, the calls so far."""

    run: str
    task: int  # index into the world's tasks
    workspace: str | None = None
    slot: int = -2  # the file's candidate: -1 the reference, w >= 0 wrong candidate w, -2 none yet
    tests_written: bool = False
    tests_at_start: bool = False  # the workspace held this task's tests before the run (an earlier run of it)
    calls: dict[str, int] = field(default_factory=dict)


# The styles the world's test engineer writes the task's verified cases in: what models write when SAGE's
# template asks for pytest tests (sage_world.world.verified_tests). Every style checks every case with the
# same comparison (``_same``; ``approx`` uses pytest.approx exactly where ``_same`` compares a float, within
# the same tolerance), so a right file passes and every verified wrong candidate fails whatever the style.
TEST_STYLES = ("plain", "fixtures", "raises", "parametrize", "classes", "tmp_path", "monkeypatch", "approx",
               "testclient", "unittest")
# What the world writes by default: every style but FastAPI's TestClient, which SAGE's gate in the harness cannot
# run yet: harness.sage_env puts a *symlink* to SAGE's Python on PATH, and a symlinked virtualenv interpreter
# runs as its base interpreter (no pyvenv.cfg beside the link), which has pytest but not FastAPI or httpx, so the
# gate would fail a right file. WorldConfig(test_styles=TEST_STYLES) writes it too (the sandbox runs it: the
# image has FastAPI); make it the default once the harness runs SAGE's virtualenv.
DEFAULT_TEST_STYLES = tuple(s for s in TEST_STYLES if s != "testclient")
# names the styles define beside the entry point: a task whose function is named so gets the plain style
_STYLE_NAMES = {"cases", "call", "client", "app", "run_case", "json", "resource", "signal", "pytest", "unittest",
                "FastAPI", "JSONResponse", "TestClient", "CASES"}

_SAME = ("def _same(got, want):\n"
         "    if isinstance(want, float) or isinstance(got, float):\n"
         "        return isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want))\n"
         "    if isinstance(want, list):\n"
         "        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))\n"
         "    if isinstance(want, dict):\n"
         "        return (isinstance(got, dict) and got.keys() == want.keys()\n"
         "                and all(_same(got[k], want[k]) for k in want))\n"
         "    return type(got) is type(want) and got == want\n")
# pytest.approx where _same compares numbers with a float among them (the same tolerance: 1e-9 relative,
# 1e-9 absolute), _same for the rest
_CLOSE = ("def _close(got, want):\n"
          "    if type(want) is float or (type(want) is int and isinstance(got, float)):\n"
          "        return isinstance(got, (int, float)) and got == pytest.approx(want, rel=1e-9, abs=1e-9)\n"
          "    return _same(got, want)\n")


def _needs_arguments(signature: str) -> bool:
    """Whether calling the task's function with no arguments raises TypeError (a required parameter, no *args)."""
    try:
        fn = ast.parse(signature.strip().rstrip(":") + ": pass").body[0]
    except SyntaxError:
        return False
    if not isinstance(fn, ast.FunctionDef):
        return False
    a = fn.args
    positional = a.posonlyargs + a.args
    return a.vararg is None and (len(positional) > len(a.defaults)
                                 or any(d is None for d in a.kw_defaults))


def style_for(seed: int, task: TaskRecord, styles: Sequence[str] = TEST_STYLES) -> str:
    """The style the world's test engineer writes ``task``'s tests in: drawn by (seed, task), so the same seed
    gives every run of a task the same file; ``plain`` where a style cannot apply (``raises`` needs a function
    that takes arguments; no style may shadow the function's name)."""
    style = styles[int(_draw(seed, "test_style", task.task_id).integers(len(styles)))]
    if task.entry_point in _STYLE_NAMES or (style == "raises" and not _needs_arguments(task.signature)):
        return "plain"
    return style


def verified_tests(task: TaskRecord, style: str = "plain") -> str:
    """The task's verified tests as a pytest module in ``style`` (one of TEST_STYLES), unchanged by the judge:
    SAGE's gate runs it with ``python -m pytest -q``. The module cannot hang or exhaust the machine: the code
    under test gets at most 2 GiB of address space (a lower limit, the sandbox's, is left alone) and an alarm
    of the task's time limit per case (set after the imports, so pytest's and FastAPI's do not count)."""
    if style not in TEST_STYLES:
        raise WorldError(f"no test style {style!r}: the world writes {', '.join(TEST_STYLES)}")
    mod, ep = module_of(task), task.entry_point
    seconds = max(2, math.ceil(task.timeout_s * max(1, len(task.tests)) + 1))
    imports = ["import json", "import resource", "import signal"]
    if style == "unittest":
        imports.append("import unittest")
    extra = []
    if style not in ("plain", "unittest", "classes"):
        extra.append("import pytest")
    if style == "testclient":
        extra += ["from fastapi import FastAPI", "from fastapi.responses import JSONResponse",
                  "from fastapi.testclient import TestClient"]
    head = (f'"""Tests of {ep} ({task.task_id}): the task\'s verified cases ({style} style)."""\n'
            + "\n".join(imports) + "\n\n" + ("\n".join(extra) + "\n\n" if extra else "")
            + "# the code under test gets at most 2 GiB and the task's time (a lower limit is left as it is)\n"
            "_soft, _hard = resource.getrlimit(resource.RLIMIT_AS)\n"
            "if _hard == resource.RLIM_INFINITY or _hard > 2 << 30:\n"
            "    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            f"signal.alarm({seconds})\n\n"
            f"from {mod} import {ep}  # noqa: E402\n\n"
            f"CASES = json.loads({json.dumps(json.dumps(task.tests))})\n\n\n" + _SAME + "\n\n")
    got = f'json.loads(json.dumps({ep}(*case["args"])))'
    check = 'assert _same(got, case["expected"]), (case["args"], got, case["expected"])'
    loop = f"    for case in CASES:\n        got = {got}\n        {check}\n"
    body = {
        "plain": f"def test_{ep}():\n{loop}",
        "fixtures": ('@pytest.fixture(scope="module")\ndef cases():\n    return [dict(case) for case in CASES]\n\n\n'
                     f"@pytest.fixture\ndef call():\n    def run(args):\n"
                     f"        return json.loads(json.dumps({ep}(*args)))\n    return run\n\n\n"
                     f"def test_{ep}_on_every_case(cases, call):\n    for case in cases:\n"
                     f'        got = call(case["args"])\n        {check}\n'),
        "raises": (f"def test_{ep}_needs_its_arguments():\n    with pytest.raises(TypeError):\n        {ep}()\n\n\n"
                   f"def test_{ep}():\n{loop}"),
        "parametrize": ('@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])\n'
                        f"def test_{ep}(case):\n    got = {got}\n    {check}\n"),
        "classes": (f"class Test{ep.title().replace('_', '')}:\n"
                    "    def setup_method(self):\n        self.cases = [dict(case) for case in CASES]\n\n"
                    f"    def test_is_a_function(self):\n        assert callable({ep})\n\n"
                    "    def test_every_case(self):\n        for case in self.cases:\n"
                    f"            got = {got}\n            {check}\n"),
        "tmp_path": (f"def test_{ep}_on_cases_read_from_a_file(tmp_path):\n"
                     '    path = tmp_path / "cases.json"\n    path.write_text(json.dumps(CASES), encoding="utf-8")\n'
                     '    for case in json.loads(path.read_text(encoding="utf-8")):\n'
                     f"        got = {got}\n        {check}\n"),
        "monkeypatch": (f"def test_{ep}_ignores_the_working_folder(tmp_path, monkeypatch):\n"
                        '    monkeypatch.chdir(tmp_path)\n    monkeypatch.setenv("LC_ALL", "C")\n' + loop),
        "approx": (_CLOSE + f"\n\ndef test_{ep}():\n    for case in CASES:\n        got = {got}\n"
                   '        assert _close(got, case["expected"]), (case["args"], got, case["expected"])\n'),
        "testclient": ("app = FastAPI()\n\n\n"
                       '@app.get("/cases/{i}")\n'
                       f'def run_case(i: int):\n    return JSONResponse({{"result": {ep}(*CASES[i]["args"])}})\n\n\n'
                       "@pytest.fixture\ndef client():\n    return TestClient(app)\n\n\n"
                       f"def test_{ep}_over_http(client):\n    for i, case in enumerate(CASES):\n"
                       '        response = client.get(f"/cases/{i}")\n'
                       "        assert response.status_code == 200, response.text\n"
                       '        got = response.json()["result"]\n'
                       f"        {check}\n"),
        "unittest": (f"class Test{ep.title().replace('_', '')}(unittest.TestCase):\n"
                     "    def setUp(self):\n        self.cases = [dict(case) for case in CASES]\n\n"
                     "    def test_every_case(self):\n        for case in self.cases:\n"
                     f"            got = {got}\n"
                     '            self.assertTrue(_same(got, case["expected"]),\n'
                     '                            (case["args"], got, case["expected"]))\n'),
    }[style]
    return head + body


class ModelWorld:
    """The world over ``sim``'s tasks (a :class:`SageLoopSim`: the calibrated chances), answering
    as SAGE's models would; ``table`` is SAGE's own models.yaml (its rows are the routed
    alternatives the truth covers). Thread-safe: one server serves concurrent runs."""

    def __init__(self, sim: SageLoopSim, table: RoutingTable, config: WorldConfig | None = None,
                 model_time: ModelTimeConfig | None = None, skills: SkillsWorldConfig | None = None) -> None:
        self.sim, self.table, self.config = sim, table, config or WorldConfig()
        self.time = model_time or ModelTimeConfig.load()
        self.tasks = sim.tasks
        self.by_id = {t.task_id: i for i, t in enumerate(self.tasks)}
        self._runs: dict[str, _Run] = {}
        self._assigned: dict[str, int] = {}
        self._workspace: dict[str, str | None] = {}
        self._tests_in: set[tuple[str, int]] = set()  # (workspace, task) whose tests SAGE wrote there
        self._lock = threading.Lock()
        self.truth: list[dict] = []
        self.adopted: list[dict] = []  # runs made for unmarked goals, in the order SAGE planned them
        calibrated = set(sim.code_models) | set(sim.debug_models)
        for role in ("coder", "debugger", "reviewer"):
            for m in self.row(role):
                if self.calibrated(m) not in calibrated:
                    raise WorldError(f"{table.source}: routing.{role} names {m!r}, which the calibration "
                                     f"({sim.config.source}) has no figures for; add an alias in WorldConfig.aliases "
                                     f"to one of {sorted(calibrated)}")
        for role, r in table.routes.items():
            for m in (r.primary, r.fallback):
                if self.calibrated(m) not in self.time.models:
                    raise WorldError(f"{table.source}: routing.{role} names {m!r}, which the model-time file "
                                     f"({self.time.source}) has no figures for; add it there (its parameters and "
                                     f"their source) or an alias in WorldConfig.aliases to one of "
                                     f"{sorted(self.time.models)}")
        for name, tm in self.time.models.items():
            cal = sim.config.models.get(name)
            if tm.api and (cal is None or cal.price is None):
                raise WorldError(f"{self.time.source}: models.{name} is an API model without a list price in "
                                 f"{sim.config.source}: add `models.{name}.price` there")
        self._code = {m: j for j, m in enumerate(sim.code_models)}
        self._p_code: dict[tuple[int, str], float] = {}  # (task, model) -> chance: the truth asks often
        self._debug = {m: j for j, m in enumerate(sim.debug_models)}
        self.skills = SkillsWorld(skills)  # a test harness, off by default (skills_world.py)

    # ------------------------------------------------------------------ models and chances
    def calibrated(self, model: str) -> str:
        return self.config.aliases.get(model, model)

    def row(self, role: str) -> tuple[str, str]:
        r = self.table.routes[role]
        return (r.primary, r.fallback)

    def p_code(self, task: int, model: str) -> float:
        """The chance that ``model``'s first attempt at ``task`` is right (the calibration's coder)."""
        got = self._p_code.get((task, model))
        if got is None:
            m = self.calibrated(model)
            if m not in self._code:
                raise WorldError(f"model {model!r} has no coder figures in {self.sim.config.source}")
            counts = np.zeros((1, self.sim.n_calls), dtype=np.int64)
            got = self._p_code[task, model] = float(self.sim.p_code(np.array([task]), counts)[0, self._code[m]])
        return got

    def p_coder(self, task: int, model: str) -> float:
        """The chance that the coder's first attempt at ``task`` with ``model`` is right: :meth:`p_code` moved by
        ``WorldConfig.coder_shift`` (its entry for ``model`` or for the calibrated name it is), clipped to [0, 1];
        exactly :meth:`p_code` for a model without a shift. What the world draws the coder's answer from and what
        the truth values it by (:mod:`.truth`)."""
        p = self.p_code(task, model)
        shift = self.config.coder_shift
        d = shift.get(model, shift.get(self.calibrated(model)))
        return p if d is None else min(1.0, max(0.0, p + float(d)))

    def p_fix(self, task: int, slot: int, model: str) -> float:
        """The chance that ``model``'s repair of the file in ``slot`` is right (1 for a right file)."""
        if slot == -1:
            return 1.0
        m = self.calibrated(model)
        if m not in self._debug:
            raise WorldError(f"model {model!r} has no debugger figures in {self.sim.config.source}")
        return float(self.sim.p_debug[task, slot, self._debug[m]])

    def review_accuracy(self, task: int, model: str) -> float:
        return 0.5 + 0.5 * self.p_code(task, model)

    def chance(self, role: str, task: int, model: str, slot: int = -1, instruction_live: bool = False) -> float:
        """The exact chance of ``role``'s right answer with or without the planted instruction live in its
        prompt (``self.skills.config``; the same with and without unless the mode is planted and ``role`` is
        the planted role): the coder's first attempt (:meth:`p_coder`), the reviewer's right verdict
        (:meth:`review_accuracy`), the debugger's repair of the file in ``slot`` (:meth:`p_fix`; -1: a right
        file, which stays right, 1; -2: no file yet, its first attempt, :meth:`p_code`)."""
        if role == "coder":
            p = self.p_coder(task, model)
        elif role == "reviewer":
            p = self.review_accuracy(task, model)
        elif role == "debugger":
            if slot == -1:
                return 1.0  # a right file stays right: no draw is made
            p = self.p_code(task, model) if slot == -2 else self.p_fix(task, slot, model)
        else:
            raise WorldError(f"no chance for role {role!r}: the world draws the coder's, reviewer's and "
                             "debugger's answers")
        return self.skills.chance(role, p, instruction_live)

    # ------------------------------------------------------------------ runs
    def assign(self, run: str, task_id: str, workspace: str | None = None) -> None:
        """Tell the world which task run ``run`` is (the harness does, before starting SAGE) and in
        which SAGE workspace it runs (runs there share files: a task's tests written by an earlier run
        are still there)."""
        if task_id not in self.by_id:
            raise WorldError(f"run {run!r}: unknown task {task_id!r}")
        with self._lock:
            self._assigned[run] = self.by_id[task_id]
            self._workspace[run] = workspace

    def _run_of(self, text: str, agent: str) -> _Run:
        m = RUN_MARK.search(text)
        if m is None:
            raise WorldError(f"{agent} request names no run (no '[sage-world run=...]' mark): the harness puts "
                             "it in the goal of `sage run`")
        run = m["run"]
        r = self._runs.get(run)
        if r is None:
            if run not in self._assigned:
                raise WorldError(f"run {run!r} was never assigned a task (ModelWorld.assign)")
            ws, task = self._workspace.get(run), self._assigned[run]
            there = ws is not None and (ws, task) in self._tests_in
            r = self._runs[run] = _Run(run, task, ws, tests_written=there, tests_at_start=there)
        return r

    def _file(self, task: TaskRecord, slot: int) -> str:
        code = task.reference if slot == -1 else task.wrong_candidates()[slot].code
        # a header line keeps every candidate >= 3 lines (SAGE's reviewer fails shorter files unread)
        return f'"""{task.entry_point}: solution for task {task.task_id}."""\n\n{code.rstrip()}\n'

    def answer(self, model: str, messages: Sequence[dict]) -> tuple[str, dict]:
        """The content of ``model``'s reply to ``messages`` and its truth record (with skills on: a reflect
        request's reply and its record, which is not a call of SAGE's, see ``skills_world.py``)."""
        if self.skills.is_reflect(messages):
            return self.skills.reflect(model, messages)
        agent = agent_of(messages)
        seen, live = self.skills.seen(agent, messages) if self.skills.on else ((), False)
        text = "\n".join(str(m.get("content") or "") for m in messages)
        with self._lock:
            if agent == "planner":
                content, rec = self._planner(text, model)
            elif agent in ("documentation", "architect"):
                content, rec = self._other(agent, model)
            else:
                r = self._run_of(text, agent)
                n = r.calls.get(agent, 0)
                r.calls[agent] = n + 1
                rng = _draw(self.config.seed, r.run, agent, n)
                content, rec = getattr(self, f"_{agent}")(r, model, n, rng, live)
        if self.skills.on:
            rec.update(skills=self.skills.describe(seen), instruction_live=live)
        return content, rec

    def _adopt(self, text: str) -> str:
        """A run for a goal the harness did not mark (``sage bench``): its task by a hash of the goal's
        first paragraph (SAGE may append fix patterns after it), a new run per time it is seen."""
        goal = text.split("GOAL: ", 1)[-1].split("\n\n", 1)[0].strip()
        h = hashlib.sha256(goal.encode()).hexdigest()
        n = sum(1 for r in self.adopted if r["hash"] == h)
        run = f"adopt-{h[:10]}-{n}"
        self._assigned[run] = int(h, 16) % len(self.tasks)
        self._workspace[run] = "adopted"  # `sage bench` runs all its prompts, both arms, in one folder
        self.adopted.append({"run": run, "hash": h, "goal": goal[:200],
                             "task_id": self.tasks[self._assigned[run]].task_id})
        return run

    def _planner(self, text: str, model: str) -> tuple[str, dict]:
        m = RUN_MARK.search(text)
        if m is None and self.config.adopt_unmarked:
            run = self._adopt(text)
        elif m is None or m["run"] not in self._assigned:
            raise WorldError("planner goal names no assigned run: start `sage run` through the harness")
        else:
            run = m["run"]
        task = self.tasks[self._assigned[run]]
        mod = module_of(task)
        desc = (f"[sage-world run={run}] Implement `{task.signature}` in {mod}.py at the project root. "
                + task.prompt.replace("\n", " "))
        dag = {"brainstorm_questions": [], "confirmed": True, "dag": {"nodes": [
            {"id": "task_001", "description": desc, "dependencies": [], "assigned_agent": "coder",
             "verification": f"python -m pytest -q tests/test_{mod}.py"}]}}
        return json.dumps(dag), {"run": run, "task_id": task.task_id, "agent": "planner", "model": model}

    def _other(self, agent: str, model: str) -> tuple[str, dict]:
        if agent == "documentation":
            body = {"file": "README.md", "operation": "create",
                    "patch": "# Project\n\nWritten by the model world.\n\nSee the modules at the project root.\n"}
        else:
            body = {"folders": [], "files": [], "tech_decisions": {}, "summary": "single-module task"}
        return json.dumps(body), {"agent": agent, "model": model}

    def _base(self, r: _Run, agent: str, model: str, n: int) -> dict:
        return {"run": r.run, "task_id": self.tasks[r.task].task_id, "agent": agent, "model": model,
                "call": n, "slot_before": r.slot}

    def _coder(self, r: _Run, model: str, n: int, rng: np.random.Generator, live: bool) -> tuple[str, dict]:
        task = self.tasks[r.task]
        p = self.chance("coder", r.task, model, instruction_live=live)
        rec = self._base(r, "coder", model, n)
        r.slot = -1 if rng.random() < p else int(rng.integers(len(task.wrong_candidates())))
        rec.update(p_right={m: self.chance("coder", r.task, m, instruction_live=live) for m in self.row("coder")},
                   slot_after=r.slot)
        mod = module_of(task)
        return json.dumps({"file": f"{mod}.py", "operation": "create", "patch": self._file(task, r.slot),
                           "reason": f"implement {task.entry_point}", "epistemic_flags": []}), rec

    def _reviewer(self, r: _Run, model: str, n: int, rng: np.random.Generator, live: bool) -> tuple[str, dict]:
        right = r.slot == -1
        acc = self.chance("reviewer", r.task, model, instruction_live=live)
        says_pass = right if rng.random() < acc else not right
        rec = self._base(r, "reviewer", model, n)
        rec.update(accuracy=acc, right=right, verdict="PASS" if says_pass else "FAIL")
        c = self.config
        if says_pass:
            body = {"verdict": "PASS", "score": c.review_pass_score, "issues": [], "suggestion": ""}
        else:
            body = {"verdict": "FAIL", "score": c.review_fail_score,
                    "issues": ["HIGH: the function does not meet the task's examples"],
                    "suggestion": "Check the edge cases against the task's examples."}
        return json.dumps(body), rec

    def _test_engineer(self, r: _Run, model: str, n: int, rng: np.random.Generator,
                       live: bool) -> tuple[str, dict]:
        task = self.tasks[r.task]
        r.tests_written = True
        if r.workspace is not None:
            self._tests_in.add((r.workspace, r.task))
        rec = self._base(r, "test_engineer", model, n)
        style = style_for(self.config.seed, task, self.config.test_styles)
        rec["test_style"] = style
        return json.dumps({"file": f"tests/test_{module_of(task)}.py", "operation": "create",
                           "patch": verified_tests(task, style), "reason": f"the task's verified cases ({style})"}), rec

    def _debugger(self, r: _Run, model: str, n: int, rng: np.random.Generator, live: bool) -> tuple[str, dict]:
        task = self.tasks[r.task]
        k = n + 1  # SAGE's failure count for its k-th debugger call (next_retry)
        rec = self._base(r, "debugger", model, n)
        rec.update(failure_count=k, tests_written=r.tests_written,
                   p_right={m: self.skills.chance("debugger", self.p_fix(r.task, r.slot, m), live and r.slot != -1)
                            for m in self.row("debugger")})
        if r.slot == -2:  # nothing written yet (the coder's reply was unusable): write a first attempt
            right = rng.random() < self.chance("debugger", r.task, model, slot=-2, instruction_live=live)
            r.slot = -1 if right else int(rng.integers(len(task.wrong_candidates())))
        elif r.slot >= 0 and rng.random() < self.chance("debugger", r.task, model, r.slot, live):
            r.slot = -1
        rec["slot_after"] = r.slot
        patch = {"file": f"{module_of(task)}.py", "operation": "edit", "patch": self._file(task, r.slot),
                 "reason": "repair", "suspected_cause": "the failing case (0.60)", "epistemic_flags": []}
        return json.dumps({"phase_3_hypothesize": {"most_likely_cause": "the failing case", "confidence": 0.6,
                                                   "reasoning": "the error names the failing check"},
                           "phase_4_patch": patch}), rec

    def final_right(self, run: str) -> bool:
        """Whether the file run ``run`` ended with is the task's right solution."""
        with self._lock:
            r = self._runs.get(run)
            return r is not None and r.slot == -1

    def tests_at_start(self, run: str) -> bool:
        with self._lock:
            r = self._runs.get(run)
            return r is not None and r.tests_at_start

    def coder_model(self, run: str) -> str | None:
        """The model the coder of run ``run`` called (SAGE's bandit chose it), or None."""
        with self._lock:
            return next((t["model"] for t in self.truth if t.get("run") == run and t.get("agent") == "coder"), None)

    # ------------------------------------------------------------------ reporting
    def tokens(self, messages: Sequence[dict], content: str) -> tuple[int, int]:
        cpt = self.config.chars_per_token
        prompt = sum(len(str(m.get("content") or "")) for m in messages)
        return max(1, math.ceil(prompt / cpt)), max(1, math.ceil(len(content) / cpt))

    def _timed(self, agent: str, model: str) -> str:
        if agent not in AGENTS:
            raise WorldError(f"no SAGE agent {agent!r}: the agents are {list(AGENTS)}")
        m = self.calibrated(model)
        if m not in self.time.models:
            raise WorldError(f"model {model!r} has no figures in {self.time.source}: SAGE's table names "
                             f"{sorted({x for r in self.table.routes.values() for x in (r.primary, r.fallback)})}")
        return m

    def call_time(self, agent: str, model: str) -> tuple[float, float]:
        """(prompt-processing, generation) GPU-seconds of one call: ``call_seconds`` split as Ollama
        reports it (``prompt_eval_duration``, ``eval_duration``)."""
        return self.time.split(agent, self._timed(agent, model))

    def call_seconds(self, agent: str, model: str) -> float:
        """GPU-seconds of one call of SAGE's ``agent`` to ``model`` (an alias counts as the model it
        names): ``prompt_tokens(agent) / prefill_tokens_per_s(model) + completion_tokens(agent) /
        decode_tokens_per_s(model)`` (``sim/data/model_time.yaml``), 0 for an API model. It depends
        on nothing else (not the task, the run or the answer drawn), so the truth is exact; the
        server sleeps ``config.clock_scale`` times it. WorldError for a model without figures."""
        return sum(self.call_time(agent, model))

    def call_usd(self, agent: str, model: str) -> float:
        """Dollars of one call: an API model's list price (``sage_loop.yaml``) x the agent's tokens of
        ``model_time.yaml``; 0 for a local model (its cost is its GPU-seconds)."""
        m = self._timed(agent, model)
        if not self.time.models[m].api:
            return 0.0
        price, tok = self.sim.config.models[m].price, self.time.assumptions.call_tokens.value[agent]
        return (tok.prompt * price.input_per_mtok + tok.completion * price.output_per_mtok) / 1e6

    def outcome_kind(self, task: int, slot: int) -> str:
        if slot == -1:
            return "pass"
        if slot < 0:
            return "none"
        return OUTCOME_KINDS[int(self.sim.outcomes.wrong_kind[task, slot])]


def build_world(table: str | Path, n_tasks: int = 300, task_seed: int = 0, config: WorldConfig | None = None,
                workers: int = 2,
                progress=lambda msg: None, model_time: ModelTimeConfig | None = None,
                skills: SkillsWorldConfig | None = None) -> ModelWorld:
    """The world over ``n_tasks`` generated coding tasks (``sim.tasks.generate_tasks``), each verified
    and its wrong candidates' outcomes measured by the local sandbox (the tasks are the project's
    own, trusted code), with the calibration of ``sim/data/sage_loop.yaml`` (and ``model_time``: the
    GPU time of ``sim/data/model_time.yaml`` by default); ``table``: SAGE's own
    models.yaml, the one its router reads (``SageInstall.models_yaml``); ``skills``: the skills harness
    (:mod:`.skills_world`; off by default)."""
    from sage_pipeline.sim import tasks as task_gen
    from sage_pipeline.sim.env import resolve_outcomes
    from sage_pipeline.sim.sandbox import open_sandbox

    tasks = task_gen.generate_tasks(n_tasks, seed=task_seed)
    with open_sandbox("local", workers=workers) as sb:
        run = lambda jobs: sb.run(jobs)  # noqa: E731
        tasks, report = task_gen.verify_tasks(tasks, run)
        progress(f"model world: {len(tasks)} of {n_tasks} tasks verified")
        usable, outcomes, skipped = resolve_outcomes(tasks, None, run)
    sim = SageLoopSim(usable, outcomes, SageLoopConfig.load(), RoutingTable.load(SageLoopConfig.load().routing_table),
                      skipped)
    for i, t in enumerate(sim.tasks):  # the world indexes wrong candidates as the outcomes do
        if [c.candidate_id for c in t.wrong_candidates()] != list(outcomes.wrong_ids[i]):
            raise WorldError(f"task {t.task_id}: wrong candidates out of order with their outcomes")
    progress(f"model world: {len(sim.tasks)} tasks with verified wrong candidates ({len(skipped)} skipped)")
    return ModelWorld(sim, RoutingTable.load(table), config, model_time, skills)


def write_truth(records: Sequence[dict], path: str | Path) -> Path:
    from sage_pipeline import artifacts

    return artifacts.write_text(Path(path), "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def world_info(world: ModelWorld) -> dict[str, Any]:
    """What the truth file's readers need besides the records: the rows and the settings."""
    info = {"seed": world.config.seed, "config": world.config.model_dump(), "table": str(world.table.source),
            "calibration": world.sim.config.source, "model_time": world.time.source,
            "rows": {r: world.row(r) for r in ("coder", "debugger", "reviewer")},
            "tasks": len(world.tasks), "max_retries": MAX_RETRIES}
    if world.skills.on:  # the skills harness, when on (off: the info as it always was)
        info["skills"] = world.skills.config.model_dump()
    return info
