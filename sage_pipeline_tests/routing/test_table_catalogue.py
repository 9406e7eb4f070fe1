"""The static SAGE routing table and the model catalogue: semantics and load errors."""

from __future__ import annotations

import copy
import operator
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from sage_pipeline.errors import ConfigError
from sage_pipeline.routing.catalogue import DEFAULT_CATALOGUE, ModelCatalogue
from sage_pipeline.routing.schema import ROLE_INDEX, ROLES
from sage_pipeline.sage.table import DEFAULT_TABLE, TRIGGER_VARS, RoutingTable, Trigger, sage_number

ROLE_LIST = ", ".join(ROLES)


def table_doc() -> dict:
    return yaml.safe_load(DEFAULT_TABLE.read_text(encoding="utf-8"))


def catalogue_doc() -> dict:
    return yaml.safe_load(DEFAULT_CATALOGUE.read_text(encoding="utf-8"))


def one_trigger_table(expr: object, role: str = "coder") -> dict:
    doc = table_doc()
    doc["routing"][role]["fallback_triggers"] = [expr]
    return doc


def choose_one(table, catalogue, role, complexity=0.5, pfc=0, fc=0) -> str:
    idx = table.choose(
        catalogue, np.array([ROLE_INDEX[role]]), np.array([complexity]), np.array([pfc]), np.array([fc])
    )
    return catalogue.actions[int(idx[0])]


# ------------------------------------------------------------------ defaults
def test_default_catalogue_and_table_load(catalogue, table):
    assert catalogue.actions == (
        "claude-opus-4",
        "claude-sonnet-4",
        "gpt-4.1",
        "gpt-4.1-mini",
        "qwen2.5-coder-32b",
        "llama-3.1-8b",
    )
    assert catalogue.source == str(DEFAULT_CATALOGUE)
    assert table.source == str(DEFAULT_TABLE)
    assert set(table.routes) == set(ROLES)
    assert catalogue.candidates("planner") == (
        "claude-opus-4",
        "claude-sonnet-4",
        "gpt-4.1",
        "gpt-4.1-mini",
        "llama-3.1-8b",
    )
    assert catalogue.candidates("coder") == (
        "claude-opus-4",
        "claude-sonnet-4",
        "gpt-4.1",
        "gpt-4.1-mini",
        "qwen2.5-coder-32b",
    )
    mask = catalogue.role_mask()
    assert mask.shape == (len(ROLES), 6)
    assert mask[ROLE_INDEX["architect"]].tolist() == [True, True, True, True, False, False]
    cap = catalogue.capability_matrix()
    assert np.isnan(cap[~mask]).all() and not np.isnan(cap[mask]).any()
    assert cap[ROLE_INDEX["coder"], catalogue.index["qwen2.5-coder-32b"]] == 0.74
    coder = table.routes["coder"]
    assert (coder.primary, coder.fallback) == ("gpt-4.1-mini", "claude-sonnet-4")
    assert [str(t) for t in coder.triggers] == ["task_complexity_score > 0.8", "primary_failure_count >= 2"]
    # every default route is a candidate for its role
    for r in ROLES:
        assert table.routes[r].primary in catalogue.candidates(r)
        assert table.routes[r].fallback in catalogue.candidates(r)


def test_catalogue_cost_and_latency(catalogue):
    a = np.array([catalogue.index["claude-opus-4"], catalogue.index["llama-3.1-8b"]])
    cost = catalogue.cost_usd(a, np.array([2000.0, 4000.0]))
    assert cost == pytest.approx([0.060 + 0.015 * 2, 0.0002 + 0.00005 * 4], abs=1e-15)
    lat = catalogue.latency_s(a, np.array([4000.0, 8000.0]))
    assert lat == pytest.approx([22.0, 2.0 * 1.5], abs=1e-12)


# ------------------------------------------------------------------ semantics
def test_sage_semantics_primary_unless_a_trigger_fires(table, catalogue):
    # coder: primary gpt-4.1-mini; fallback claude-sonnet-4 when complexity > 0.8 or pfc >= 2
    assert choose_one(table, catalogue, "coder", 0.5, 0, 0) == "gpt-4.1-mini"
    assert choose_one(table, catalogue, "coder", 0.8, 0, 0) == "gpt-4.1-mini"  # strict >
    assert choose_one(table, catalogue, "coder", 0.8001, 0, 0) == "claude-sonnet-4"
    assert choose_one(table, catalogue, "coder", 0.1, 1, 3) == "gpt-4.1-mini"  # failure_count unused
    assert choose_one(table, catalogue, "coder", 0.1, 2, 2) == "claude-sonnet-4"
    assert choose_one(table, catalogue, "coder", 0.9, 5, 5) == "claude-sonnet-4"  # both fire: still fallback
    # debugger has no complexity trigger
    assert choose_one(table, catalogue, "debugger", 1.0, 1, 1) == "gpt-4.1-mini"
    assert choose_one(table, catalogue, "debugger", 0.0, 2, 2) == "gpt-4.1"
    # memory_optimizer falls back on any failure, primary or not
    assert choose_one(table, catalogue, "memory_optimizer", 0.2, 0, 0) == "llama-3.1-8b"
    assert choose_one(table, catalogue, "memory_optimizer", 0.2, 0, 1) == "gpt-4.1-mini"
    # a trigger only applies to its own role: planner's 0.85 threshold, not coder's 0.8
    assert choose_one(table, catalogue, "planner", 0.84, 0, 0) == "gpt-4.1"
    assert choose_one(table, catalogue, "planner", 0.86, 0, 0) == "claude-opus-4"


def test_role_without_triggers_follows_sages_back_compat_rule(catalogue):
    # SAGE's ModelRouter.should_use_fallback: no triggers -> failure_count >= 2 or task_complexity_score > 0.8
    doc = table_doc()
    doc["routing"]["coder"]["fallback_triggers"] = []
    del doc["routing"]["reviewer"]["fallback_triggers"]
    t = RoutingTable.from_dict(doc)
    assert t.routes["coder"].triggers == () and t.routes["reviewer"].triggers == ()
    for c, pfc, fb in ((1.0, 9, True), (0.0, 0, False), (0.81, 0, True), (0.8, 1, False), (0.0, 2, True)):
        assert (choose_one(t, catalogue, "coder", c, pfc, pfc) == t.routes["coder"].fallback) is fb
        assert (choose_one(t, catalogue, "reviewer", c, pfc, pfc) == t.routes["reviewer"].fallback) is fb


def _scalar_choose(table: RoutingTable, role: int, c: float, pfc: int, fc: int) -> str:
    """Reference: SAGE's router, one decision at a time."""
    ops = {
        ">": operator.gt,
        ">=": operator.ge,
        "<": operator.lt,
        "<=": operator.le,
        "==": operator.eq,
        "!=": operator.ne,
    }
    route = table.routes[ROLES[role]]
    values = {"task_complexity_score": c, "primary_failure_count": pfc, "failure_count": fc}
    for trig in route.triggers:
        if ops[trig.op](values[trig.var], trig.value):
            return route.fallback
    return route.primary


def test_vectorised_choose_matches_scalar_reference(table, catalogue):
    rng = np.random.default_rng(7)
    n = 4000
    role = rng.integers(0, len(ROLES), n)
    # include exact threshold values so boundary handling is compared too
    c = np.where(rng.random(n) < 0.2, rng.choice([0.7, 0.8, 0.85, 0.9], n), np.round(rng.random(n), 3))
    fc = rng.integers(0, 5, n)
    pfc = np.minimum(rng.integers(0, 4, n), fc)
    got = table.choose(catalogue, role, c, pfc, fc)
    want = [catalogue.index[_scalar_choose(table, role[i], c[i], pfc[i], fc[i])] for i in range(n)]
    assert got.tolist() == want
    fired = table.fallback_fires(role, c, pfc, fc)
    assert 0.1 < fired.mean() < 0.9  # both branches are exercised
    assert (got[fired] == table.fallback_index(catalogue)[role[fired]]).all()
    assert (got[~fired] == table.primary_index(catalogue)[role[~fired]]).all()


@pytest.mark.parametrize(
    ("op", "fires_at"),
    [
        (">", [False, False, True]),
        (">=", [False, True, True]),
        ("<", [True, False, False]),
        ("<=", [True, True, False]),
        ("==", [False, True, False]),
        ("!=", [True, False, True]),
    ],
)
def test_every_trigger_operator(op, fires_at, catalogue):
    t = RoutingTable.from_dict(one_trigger_table(f"task_complexity_score {op} 0.5"))
    trig = t.routes["coder"].triggers[0]
    assert (trig.var, trig.op, trig.value) == ("task_complexity_score", op, 0.5)
    assert str(trig) == f"task_complexity_score {op} 0.5"
    c = np.array([0.4, 0.5, 0.6])
    role = np.full(3, ROLE_INDEX["coder"])
    zeros = np.zeros(3, dtype=np.int64)
    assert t.fallback_fires(role, c, zeros, zeros).tolist() == fires_at
    chosen = [catalogue.actions[i] for i in t.choose(catalogue, role, c, zeros, zeros)]
    assert chosen == ["claude-sonnet-4" if f else "gpt-4.1-mini" for f in fires_at]


@pytest.mark.parametrize(
    ("expr", "var", "op", "value"),
    [
        ("failure_count>=1", "failure_count", ">=", 1.0),
        ("  primary_failure_count   ==   2  ", "primary_failure_count", "==", 2.0),
        ("task_complexity_score > 0.75", "task_complexity_score", ">", 0.75),
    ],
)
def test_trigger_number_formats(expr, var, op, value):
    assert Trigger.parse(expr, source="s", role="coder", i=0) == Trigger(var, op, value)


@pytest.mark.parametrize("expr", ["task_complexity_score > .75", "task_complexity_score <= 7.5e-1",
                                  "failure_count != -1", "failure_count >= 2.", "failure_count >= +2"])
def test_numbers_sages_parser_ignores_are_refused(expr):
    # SAGE's model_router._eval_fallback_trigger reads [0-9]+(.[0-9]+)? only and never fires anything else
    with pytest.raises(ConfigError, match="SAGE cannot read the number"):
        Trigger.parse(expr, source="s", role="coder", i=0)


@pytest.mark.parametrize(("value", "text"), [(2, "2"), (2.0, "2"), (0.8, "0.8"), (0.05, "0.05"), (1e-6, "0.000001")])
def test_thresholds_are_written_in_sages_grammar(value, text):
    assert sage_number(value) == text
    assert str(Trigger("task_complexity_score", ">", value)) == f"task_complexity_score > {text}"


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_thresholds_sage_cannot_write_are_refused(value):
    with pytest.raises(ValueError, match="SAGE's trigger grammar"):
        sage_number(value)


def test_trigger_vars_are_the_documented_three():
    assert TRIGGER_VARS == ("task_complexity_score", "primary_failure_count", "failure_count")


# ------------------------------------------------------------------ table errors
FIX = "write 'variable op number', e.g. 'task_complexity_score > 0.8'"


@pytest.mark.parametrize(
    "expr",
    [
        "complexity >> 0.8",
        "task_complexity_score > high",
        "task_complexity_score > 0.8 and failure_count > 1",
        "0.8 < task_complexity_score",
        "task_complexity_score =< 0.8",
        "task_complexity_score > 0.8.1",
        "",
    ],
)
def test_unparseable_trigger_names_role_and_expression(expr, catalogue):
    with pytest.raises(ConfigError) as err:
        RoutingTable.from_dict(one_trigger_table(expr), source="models.yaml")
    assert str(err.value) == (
        f"models.yaml: routing.coder.fallback_triggers[0]: cannot parse trigger "
        f"{expr!r} for role 'coder' ({FIX})"
    )
    assert err.value.field == "routing.coder.fallback_triggers[0]"
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("expr", [0.8, 2, None, {"task_complexity_score": 0.8}, ["a > 1"]])
def test_non_string_trigger_names_role_and_expression(expr, catalogue):
    doc = table_doc()
    doc["routing"]["planner"]["fallback_triggers"] = ["failure_count >= 1", expr]
    with pytest.raises(ConfigError) as err:
        RoutingTable.from_dict(doc, source="models.yaml")
    assert str(err.value) == (
        "models.yaml: routing.planner.fallback_triggers[1]: expected a string like "
        f"'primary_failure_count >= 2', got {expr!r}"
    )


def test_trigger_with_unknown_variable(catalogue):
    with pytest.raises(ConfigError) as err:
        RoutingTable.from_dict(
            one_trigger_table("complexity > 0.8", role="debugger"), source="m.yaml"
        )
    assert str(err.value) == (
        "m.yaml: routing.debugger.fallback_triggers[0]: unknown variable 'complexity' in trigger "
        "'complexity > 0.8' for role 'debugger' (use one of task_complexity_score, primary_failure_count, "
        "failure_count)"
    )


def test_triggers_not_a_list(catalogue):
    doc = table_doc()
    doc["routing"]["coder"]["fallback_triggers"] = "primary_failure_count >= 2"
    with pytest.raises(
        ConfigError,
        match=r"^m\.yaml: routing\.coder\.fallback_triggers: expected a list of "
        r"expressions$",
    ):
        RoutingTable.from_dict(doc, source="m.yaml")


def test_extra_roles_are_routed_in_table_order_after_the_agent_roles():
    """SAGE's own table routes shell_router and shell_chat beside the agent roles."""
    doc = table_doc()
    doc["routing"] = {"shell_chat": {"primary": "qwen3:14b-q4_K_M", "fallback": "claude-sonnet-4-5"},
                      **doc["routing"],
                      "shell_router": {"primary": "llama3.2:3b", "fallback": "qwen3:14b-q4_K_M",
                                       "fallback_triggers": ["task_complexity_score > 0.5"]}}
    t = RoutingTable.from_dict(doc, source="m.yaml")
    assert t.roles == (*ROLES, "shell_chat", "shell_router")
    assert t.models[-3:] == ("qwen3:14b-q4_K_M", "claude-sonnet-4-5", "llama3.2:3b")
    idx = {m: i for i, m in enumerate(t.models)}
    role = np.array([t.roles.index("shell_router")] * 2)
    got = t.choose(type("A", (), {"index": idx})(), role, np.array([0.4, 0.6]), np.zeros(2), np.zeros(2))
    assert [t.models[i] for i in got] == ["llama3.2:3b", "qwen3:14b-q4_K_M"]


def test_a_table_may_route_a_subset_of_the_agent_roles():
    doc = table_doc()
    del doc["routing"]["reviewer"], doc["routing"]["documentation"]
    t = RoutingTable.from_dict(doc, source="m.yaml")
    assert t.roles == tuple(r for r in ROLES if r not in ("reviewer", "documentation"))


@pytest.mark.parametrize("role", ["", 3])
def test_role_name_must_be_a_string(role):
    doc = table_doc()
    doc["routing"][role] = {"primary": "a", "fallback": "b"}
    with pytest.raises(ConfigError, match=r"a role name must be a non-empty string"):
        RoutingTable.from_dict(doc, source="m.yaml")


def test_empty_routing_mapping():
    with pytest.raises(ConfigError, match=r"^m\.yaml: routing: no roles: the table routes nothing$"):
        RoutingTable.from_dict({"routing": {}}, source="m.yaml")


@pytest.mark.parametrize("key", ["primary", "fallback"])
@pytest.mark.parametrize("value", [None, "", 3])
def test_missing_primary_or_fallback(key, value, catalogue):
    doc = table_doc()
    if value is None:
        del doc["routing"]["architect"][key]
    else:
        doc["routing"]["architect"][key] = value
    with pytest.raises(ConfigError) as err:
        RoutingTable.from_dict(doc, source="m.yaml")
    assert str(err.value) == f"m.yaml: routing.architect.{key}: missing or not a model name"


def test_models_need_not_be_in_any_catalogue():
    """Models come from the table (Ollama tags included); a catalogue only adds prices."""
    doc = table_doc()
    doc["routing"]["planner"]["primary"] = "qwen2.5-coder:1.5b"
    doc["routing"]["coder"]["fallback"] = "codestral:22b"
    t = RoutingTable.from_dict(doc)
    assert t.routes["planner"].primary == "qwen2.5-coder:1.5b" and "codestral:22b" in t.models


@pytest.mark.parametrize("doc", [None, [], {"routes": {}}, {"routing": ["coder"]}])
def test_table_without_routing_mapping(doc):
    with pytest.raises(ConfigError, match=r"^m\.yaml: routing: expected a mapping 'routing: "):
        RoutingTable.from_dict(doc, source="m.yaml")


def test_route_not_a_mapping(catalogue):
    doc = table_doc()
    doc["routing"]["coder"] = "gpt-4.1"
    with pytest.raises(
        ConfigError,
        match=r"^m\.yaml: routing\.coder: expected a mapping with primary, "
        r"fallback, fallback_triggers$",
    ):
        RoutingTable.from_dict(doc, source="m.yaml")


def test_table_file_missing(tmp_path):
    path = tmp_path / "nope" / "models.yaml"
    with pytest.raises(ConfigError) as err:
        RoutingTable.load(path)
    assert str(err.value) == (
        f"{path}: <file>: routing table not found (set routing_table in the sage "
        "resource or SAGE_ROUTING_TABLE)"
    )
    assert err.value.path == str(path)


def test_table_file_not_yaml(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("routing: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"^{path}: <file>: not valid YAML: "):
        RoutingTable.load(path)


def test_table_load_from_file_reports_file_in_error(tmp_path, catalogue):
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(one_trigger_table("task_complexity_score > high", role="reviewer")))
    with pytest.raises(ConfigError) as err:
        RoutingTable.load(path)
    assert str(err.value).startswith(
        f"{path}: routing.reviewer.fallback_triggers[0]: cannot parse trigger "
        "'task_complexity_score > high' for role 'reviewer'"
    )


# ------------------------------------------------------------------ catalogue errors
def _cat_error(doc, source="cat.yaml") -> str:
    with pytest.raises(ConfigError) as err:
        ModelCatalogue.from_dict(doc, source=source)
    return str(err.value)


@pytest.mark.parametrize("value", [1.5, -0.1, "high", True, None, float("nan")])
def test_capability_out_of_range(value):
    doc = catalogue_doc()
    doc["models"]["x"] = copy.deepcopy(doc["models"]["gpt-4.1"])
    doc["models"]["x"]["capability"]["coder"] = value
    assert (
        _cat_error(doc) == f"cat.yaml: models.x.capability.coder: expected a number in [0, 1], got {value!r}"
    )


@pytest.mark.parametrize("capability", [[0.5], "coder"])
def test_capability_not_a_mapping(capability):
    doc = catalogue_doc()
    doc["models"]["llama-3.1-8b"]["capability"] = capability
    assert (
        _cat_error(doc) == "cat.yaml: models.llama-3.1-8b.capability: expected a mapping role -> capability"
    )


def test_a_prices_only_catalogue_prices_sages_models_and_the_simulator_refuses_it(table):
    from sage_pipeline.routing.routing_simulator import RoutingSimulator

    cat = ModelCatalogue.from_dict({"models": {"qwen2.5-coder:1.5b": {"cost_per_call": 0},
                                               "claude-sonnet-4-5": {"cost_per_call": 0.01,
                                                                     "cost_per_1k_prompt_tokens": 0.003}}},
                                   source="prices.yaml")
    cost = cat.cost_usd(np.array([0, 1]), np.array([1000.0, 2000.0]))
    np.testing.assert_allclose(cost, [0.0, 0.016])
    assert cat.candidates("coder") == ()
    with pytest.raises(ConfigError, match=r"^prices\.yaml: models\.\*\.capability: no model is a candidate for "
                                          r"role 'planner': the routing simulator needs a capability per role"):
        RoutingSimulator(cat, table)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("cost_per_call", -0.01, "-0.01 outside [0.0, inf]"),
        ("cost_per_1k_prompt_tokens", -1, "-1 outside [0.0, inf]"),
        ("latency_s", -2.0, "-2.0 outside [0.0, inf]"),
        ("timeout_rate", 0.6, "0.6 outside [0.0, 0.5]"),
        ("context_tokens", 0, "0 outside [1, inf]"),
        ("cost_per_call", "cheap", "expected a finite number, got 'cheap'"),
        ("cost_per_call", float("inf"), "expected a finite number, got inf"),
        ("cost_per_call", True, "expected a finite number, got True"),
        ("cost_per_call", None, "missing"),
    ],
)
def test_catalogue_numbers_name_the_field(key, value, problem):
    doc = catalogue_doc()
    if value is None:
        del doc["models"]["gpt-4.1"][key]
    else:
        doc["models"]["gpt-4.1"][key] = value
    assert _cat_error(doc) == f"cat.yaml: models.gpt-4.1.{key}: {problem}"


def test_catalogue_optional_fields_default():
    cat = ModelCatalogue.from_dict(
        {
            "models": {
                m: {"cost_per_call": 0.01, "latency_s": 1.0, "capability": {r: 0.5 for r in ROLES}}
                for m in ("a", "b")
            }
        }
    )
    spec = cat.models[0]
    assert (spec.cost_per_1k_prompt_tokens, spec.timeout_rate, spec.context_tokens) == (0.0, 0.0, 128000)
    assert cat.actions == ("a", "b") and cat.source == "<memory>"


def test_catalogue_spec_not_a_mapping():
    doc = catalogue_doc()
    doc["models"]["gpt-4.1"] = "fast"
    assert _cat_error(doc) == "cat.yaml: models.gpt-4.1: expected a mapping"


@pytest.mark.parametrize("doc", [None, {}, {"models": {}}, {"models": ["a"]}])
def test_catalogue_without_models(doc):
    assert _cat_error(doc) == "cat.yaml: models: expected a non-empty mapping of model name -> spec"


def test_catalogue_role_without_candidate():
    doc = catalogue_doc()
    for spec in doc["models"].values():
        spec["capability"].pop("memory_optimizer", None)
    cat = ModelCatalogue.from_dict(doc, source="cat.yaml")  # fine for pricing real logs
    with pytest.raises(ConfigError) as err:
        cat.check_simulates()
    assert str(err.value).startswith(
        "cat.yaml: models.*.capability: no model is a candidate for role 'memory_optimizer'")


def test_catalogue_file_missing(tmp_path):
    path = tmp_path / "model_catalogue.yaml"
    with pytest.raises(ConfigError) as err:
        ModelCatalogue.load(path)
    assert str(err.value) == (
        f"{path}: <file>: model catalogue not found (set model_catalogue in the sage "
        "resource or SAGE_MODEL_CATALOGUE)"
    )


def test_catalogue_file_not_utf8(tmp_path):
    path = tmp_path / "model_catalogue.yaml"
    path.write_bytes(b"models:\n  \xff\xfe: {}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: <file>: not valid YAML: "):
        ModelCatalogue.load(path)


def test_catalogue_load_from_file_reports_file(tmp_path):
    doc = catalogue_doc()
    doc["models"]["gpt-4.1"]["capability"]["coder"] = 2
    path = tmp_path / "model_catalogue.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        ModelCatalogue.load(path)
    assert str(err.value) == f"{path}: models.gpt-4.1.capability.coder: expected a number in [0, 1], got 2"


# ------------------------------------------------------------------ strict YAML (issue 35)
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# SAGE's source: SAGE_SRC as `make test` takes it, else where CI lays it out.
SAGE_SRC_DIR = Path(os.environ.get("SAGE_SRC", "").strip() or PROJECT_ROOT.parent / "shared" / "upstream" / "sage")
SAGE_MODELS_YAMLS = sorted(SAGE_SRC_DIR.glob("**/models.yaml")) if SAGE_SRC_DIR.is_dir() else []


@pytest.mark.skipif(not SAGE_MODELS_YAMLS, reason=f"SAGE's source is not at {SAGE_SRC_DIR}")
@pytest.mark.parametrize("path", SAGE_MODELS_YAMLS, ids=lambda p: str(p.relative_to(SAGE_SRC_DIR)))
def test_every_models_yaml_sage_ships_loads(path):
    """SAGE's code is the contract: every table SAGE ships loads, with every role SAGE routes."""
    table = RoutingTable.load(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert set(table.routes) == set(raw["routing"])
    for role, spec in raw["routing"].items():
        assert (table.routes[role].primary, table.routes[role].fallback) == (spec["primary"], spec["fallback"])
        assert [str(t) for t in table.routes[role].triggers] == [
            str(Trigger.parse(t, source="x", role=role, i=0)) for t in spec.get("fallback_triggers") or []]


@pytest.mark.parametrize("path", sorted(PROJECT_ROOT.glob("sage_pipeline/*/data/*models*.yaml"))
                         + sorted(PROJECT_ROOT.glob("sage_pipeline_tests/**/models.yaml")),
                         ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_routing_table_the_project_ships_loads(path):
    assert RoutingTable.load(path).routes


@pytest.mark.parametrize("path", sorted(PROJECT_ROOT.glob("sage_pipeline/*/data/*catalogue*.yaml")),
                         ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_catalogue_the_project_ships_loads(path):
    assert ModelCatalogue.load(path).models


DUP_ROLE = """routing:
  coder:
    primary: a
    fallback: b
  reviewer:
    primary: a
    fallback: b
  coder:
    primary: c
    fallback: d
"""

DUP_FIELD = """routing:
  coder:
    primary: a
    fallback: b
    primary: c
"""

MISSPELT = """# SAGE's table
routing:
  coder:
    primary: a
    fallback: b
    fallback_triggers: [primary_failure_count >= 2]
  reviewer:
    primry: a
    primary: a
    fallback: b
"""


def test_table_refuses_a_duplicate_role_naming_file_line_and_key(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(DUP_ROLE)
    with pytest.raises(ConfigError) as err:
        RoutingTable.load(path)
    assert str(err.value) == (
        f"{path}:8: routing.coder: duplicate key 'coder' (first written on line 2); YAML would silently keep "
        "only the last one (keep one and delete the other)")
    assert err.value.line == 8


def test_table_refuses_a_duplicate_field_naming_file_line_and_key(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(DUP_FIELD)
    with pytest.raises(ConfigError, match=rf"^{path}:5: routing\.coder\.primary: duplicate key 'primary' "
                                          r"\(first written on line 3\)"):
        RoutingTable.load(path)


def test_table_refuses_a_misspelt_field_naming_file_line_and_key(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(MISSPELT)
    with pytest.raises(ConfigError) as err:
        RoutingTable.load(path)
    assert str(err.value) == (
        f"{path}:8: routing.reviewer.primry: unknown field 'primry': a route in SAGE's models.yaml has only "
        "primary, fallback, fallback_triggers (did you mean 'primary'? fix the spelling or delete the field)")


def test_table_refuses_an_unknown_top_level_key(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("routing:\n  coder: {primary: a, fallback: b}\nroles:\n  coder: {primary: c}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: roles: unknown field 'roles': SAGE's models.yaml has "
                                          r"only routing"):
        RoutingTable.load(path)


def test_table_from_dict_refuses_unknown_fields_without_a_line():
    with pytest.raises(ConfigError, match=r"^m\.yaml: routing\.coder\.fallbak: unknown field 'fallbak'"):
        RoutingTable.from_dict({"routing": {"coder": {"primary": "a", "fallback": "b", "fallbak": "c"}}},
                               source="m.yaml")


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("routing:\n  coder: &r {primary: a, fallback: b}\n  reviewer:\n    <<: *r\n    fallback: c\n")
    table = RoutingTable.load(path)
    assert (table.routes["reviewer"].primary, table.routes["reviewer"].fallback) == ("a", "c")


def test_catalogue_refuses_duplicate_and_unknown_fields(tmp_path):
    path = tmp_path / "model_catalogue.yaml"
    path.write_text("models:\n  m1:\n    cost_per_call: 0.1\n    cost_per_cal: 0.2\n")
    with pytest.raises(ConfigError) as err:
        ModelCatalogue.load(path)
    assert str(err.value).startswith(f"{path}:4: models.m1.cost_per_cal: unknown field 'cost_per_cal': a model "
                                     "in the catalogue has only cost_per_call, ")
    assert "did you mean 'cost_per_call'?" in str(err.value)
    path.write_text("models:\n  m1:\n    cost_per_call: 0.1\n  m1:\n    cost_per_call: 0.2\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: models\.m1: duplicate key 'm1' \(first written on line 2\)"):
        ModelCatalogue.load(path)
    path.write_text("models:\n  m1:\n    cost_per_call: 0.1\n    capability: {coder: 0.5, coder: 0.9}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: models\.m1\.capability\.coder: duplicate key 'coder'"):
        ModelCatalogue.load(path)
