"""The catalogue of SAGE's own table (routing/data/sage_model_catalogue.yaml), the project's default:
every figure in it is recomputed here from the calibrated, sourced files it says it comes from
(sim/data/sage_loop.yaml, sim/data/model_time.yaml), so a change there fails here, naming the field."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from scipy import optimize, stats

from sage_pipeline.routing.catalogue import DEFAULT_CATALOGUE, SAGE_CATALOGUE, ModelCatalogue
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.routing_simulator import ROLE_MIX, OutcomeSpec, RoutingSimulator
from sage_pipeline.routing.schema import ROLES
from sage_pipeline.sage.table import DEFAULT_TABLE, SAGE_TABLE, RoutingTable

SIM_DATA = SAGE_CATALOGUE.parents[2] / "sim" / "data"
# SAGE's Ollama tag -> the model sage_loop.yaml calibrates (the catalogue's header says why)
CALIBRATED = {"qwen2.5-coder:1.5b": "qwen2.5-coder:1.5b",
              "qwen2.5-coder:14b-instruct-q4_K_M": "qwen2.5-coder:14b",
              "qwen3:14b-q4_K_M": "qwen2.5-coder:14b",  # the stated assumption: no figure of its own
              "codestral:22b": "codestral:22b",
              "claude-sonnet-4-5": "claude-sonnet-4-5"}
PROMPT, COMPLETION = 4000.0, 600.0  # the catalogue's reference call


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


@pytest.fixture(scope="module")
def sage_cat() -> ModelCatalogue:
    return ModelCatalogue.load(SAGE_CATALOGUE)


@pytest.fixture(scope="module")
def figures() -> tuple[dict, dict]:
    loop = yaml.safe_load((SIM_DATA / "sage_loop.yaml").read_text(encoding="utf-8"))
    time = yaml.safe_load((SIM_DATA / "model_time.yaml").read_text(encoding="utf-8"))
    return loop, time


def _anchor(loop: dict, model: str, role: str) -> float:
    fig = loop["models"][CALIBRATED[model]]
    he = fig["humaneval"]["value"]
    if role != "debugger":
        return he
    p1, p2 = fig["aider"]["pass_rate_1"], fig["aider"]["pass_rate_2"]
    return _sigmoid(_logit((p2 - p1) / (1.0 - p1)) + _logit(he) - _logit(p1))


_X = (np.arange(4_000) + 0.5) / 4_000  # midpoints on [0, 1]: every ROLE_MIX Beta density is bounded there


def _capability(anchor: float, role: str) -> float:
    """The c with E_{x ~ Beta(role)}[sigmoid(sharpness (c - x))] = anchor."""
    _, a, b, _ = ROLE_MIX[role]
    s = OutcomeSpec().sharpness
    w = stats.beta.pdf(_X, a, b) / len(_X)

    def gap(c: float) -> float:
        return float(w @ (1.0 / (1.0 + np.exp(-s * (c - _X))))) - anchor
    return optimize.brentq(gap, -2.0, 3.0)


def test_it_names_exactly_the_models_of_sages_table(sage_cat):
    assert set(sage_cat.actions) == set(RoutingTable.load(SAGE_TABLE).models)
    assert set(CALIBRATED) == set(sage_cat.actions)
    # every model may serve every simulated role, as SAGE's table may name any model for any role
    assert sage_cat.role_mask().all()


def test_capabilities_are_the_published_figures_mapped_as_the_header_says(sage_cat, figures):
    loop, _ = figures
    for m in sage_cat.models:
        for role in ROLES:
            want = _capability(_anchor(loop, m.name, role), role)
            assert m.capability[role] == pytest.approx(want, abs=6e-4), \
                f"models.{m.name}.capability.{role}: {m.capability[role]}, the mapping gives {want:.3f}"


def test_the_simulator_passes_a_first_attempt_at_the_published_rate(sage_cat, figures):
    """Through the simulator's own outcome model: a model's first-try pass rate over a role's tasks
    (prompts short enough for every context) is its anchor figure."""
    loop, _ = figures
    sim = RoutingSimulator(sage_cat, RoutingTable.load(SAGE_TABLE))
    tasks = sim.sample_tasks(200_000, np.random.default_rng(0))
    zeros = np.zeros(len(tasks), dtype=np.int64)
    ctx = sim.contexts(tasks, zeros, zeros)
    ctx = Contexts(ctx.role, ctx.task_complexity_score, np.full(len(tasks), 1000.0), ctx.step,
                   ctx.failure_count, ctx.primary_failure_count)
    for k, model in enumerate(sim.actions):
        p = sim.outcome_probs(ctx, np.full(len(tasks), k))
        assert (p["p_timeout"] == 0).all()  # SAGE's default: no client timeout
        for r, role in enumerate(ROLES):
            got = float(p["p_pass"][ctx.role == r].mean())
            assert got == pytest.approx(_anchor(loop, model, role), abs=0.01), (model, role)


def test_costs_latencies_and_contexts_follow_the_stated_sources(sage_cat, figures):
    loop, time = figures
    gpu = time["gpu"]
    anchor_b = gpu["anchor_params_b"]["value"]
    for m in sage_cat.models:
        fig = loop["models"][CALIBRATED[m.name]]
        timed = time["models"].get(m.name) or time["models"][CALIBRATED[m.name]]
        if timed.get("api"):
            price = fig["price"]
            assert m.cost_per_1k_prompt_tokens == pytest.approx(price["input_per_mtok"] / 1000.0)
            assert m.cost_per_call == pytest.approx(price["output_per_mtok"] * COMPLETION / 1e6)
            aider = fig["aider"]
            assert m.latency_s == pytest.approx(aider["seconds_per_case"] / (2.0 - aider["pass_rate_1"]), abs=0.006)
            assert m.context_tokens == 200_000
        else:
            assert "price" not in fig and m.cost_per_call == 0.0 and m.cost_per_1k_prompt_tokens == 0.0
            scale = anchor_b / timed["params_b"]
            want = PROMPT / (gpu["prefill_tokens_per_s"]["value"] * scale) \
                + COMPLETION / (gpu["decode_tokens_per_s"]["value"] * scale)
            assert m.latency_s == pytest.approx(want, abs=0.006), \
                f"models.{m.name}.latency_s: the throughput gives {want:.2f}"
            assert m.context_tokens == 4096
        assert m.timeout_rate == 0.0


def test_the_simulator_runs_sages_table_and_gives_its_shell_roles_no_tasks(sage_cat):
    table = RoutingTable.load(SAGE_TABLE)
    assert table.roles[len(ROLES):] == ("shell_router", "shell_chat")
    sim = RoutingSimulator(sage_cat, table)
    tasks = sim.sample_tasks(5_000, np.random.default_rng(1))
    assert set(np.unique(tasks.role)) == set(range(len(ROLES)))
    # the table's own choice is SAGE's: the coder's primary, its fallback after two primary failures
    coder = np.full(3, ROLES.index("coder"))
    chosen = table.choose(sage_cat, coder, np.array([0.95, 0.2, 0.2]), np.array([0, 1, 2]), np.array([0, 1, 2]))
    assert [sim.actions[a] for a in chosen] == ["qwen2.5-coder:1.5b", "qwen2.5-coder:1.5b",
                                                "qwen2.5-coder:14b-instruct-q4_K_M"]


def test_a_table_missing_an_agent_role_is_refused(sage_cat):
    doc = yaml.safe_load(SAGE_TABLE.read_text(encoding="utf-8"))
    del doc["routing"]["architect"]
    with pytest.raises(ValueError, match="architect"):
        RoutingSimulator(sage_cat, RoutingTable.from_dict(doc, source="no_architect.yaml"))


def test_the_example_pair_still_loads_for_the_many_model_demos():
    cat, table = ModelCatalogue.load(DEFAULT_CATALOGUE), RoutingTable.load(DEFAULT_TABLE)
    assert len(cat.actions) == 6 and table.roles == ROLES
    RoutingSimulator(cat, table)
    # the two pairs do not mix: the example table names models the SAGE catalogue does not price
    with pytest.raises(Exception, match="gpt-4.1|claude-|llama|qwen2.5-coder-32b"):
        RoutingSimulator(ModelCatalogue.load(SAGE_CATALOGUE), table)


@pytest.mark.parametrize("space", ["multi_model", "sage_binary"])
def test_the_collector_logs_sages_table_in_either_action_space(sage_cat, tmp_path, space):
    from sage_pipeline.routing.collector import CollectorConfig, collect

    table = RoutingTable.load(SAGE_TABLE)
    sim = RoutingSimulator(sage_cat, table)
    res = collect(sim, tmp_path / "out", CollectorConfig(episodes=250, seed=5, action_space=space),
                  progress=lambda _: None)
    decisions = [e for p in res.files for e in map(json.loads, p.read_text().splitlines())
                 if e["type"] == "MODEL_ROUTING_DECISION"]
    assert len(decisions) == res.decisions > 250
    by_role: dict[str, set[str]] = {}
    for d in decisions:
        route = table.routes[d["agent_role"]]
        assert (d["primary_model"], d["fallback_model"]) == (route.primary, route.fallback)
        by_role.setdefault(d["agent_role"], set()).add(d["selected_model"])
    assert set(by_role) == set(ROLES)  # the shell roles get no tasks
    for role, models in by_role.items():
        pair = {table.routes[role].primary, table.routes[role].fallback}
        if space == "sage_binary":
            assert models <= pair, role
        else:
            assert models - pair, f"{role}: multi_model explores beyond the table's two models"
    gt = res.ground_truth
    assert gt["oracle"] >= max(gt["static_table"], gt["behaviour"], gt["uniform"])
    if space == "sage_binary":
        assert gt["oracle"] >= gt["binary_oracle"] >= gt["static_table"]


def test_a_mask_over_the_tables_roles_is_read_on_the_simulated_ones(sage_cat):
    """An action space's mask has a row per role of the table (SAGE's: ten); the simulator values
    policies on its eight simulated roles and reads those rows, and refuses a mask that misses one."""
    from sage_pipeline.routing.action_space import ActionSpace

    table = RoutingTable.load(SAGE_TABLE)
    sim = RoutingSimulator(sage_cat, table)
    binary = ActionSpace.build(table, catalogue=sage_cat).binary()
    assert binary.actions == sim.actions and binary.mask.shape == (len(table.roles), sim.K) == (10, 5)
    assert (sim.allowed(binary.mask) == binary.mask[:len(ROLES)]).all()
    tasks = sim.sample_tasks(300, np.random.default_rng(2))
    wide, narrow = sim.optimal_value(tasks, binary.mask), sim.optimal_value(tasks, binary.mask[:len(ROLES)])
    assert np.array_equal(wide.per_task, narrow.per_task)
    assert sim.optimal_value(tasks).mean >= wide.mean  # every candidate: at least the best binary policy
    with pytest.raises(ValueError, match="does not cover"):
        sim.allowed(binary.mask[:5])
