"""Every task family: valid references that run on their own inputs, edge cases, distinct parametric tasks,
hand-written variants that apply and change the code."""

from __future__ import annotations

import ast
import json
import random

import pytest

from sage_pipeline.sim import mutants
from sage_pipeline.sim.families import FAMILIES, FamilyError, TaskSpec
from sage_pipeline.sim.families.base import family, spec
from sage_pipeline.sim.schema import CANDIDATE_KINDS

DRAWS = 12  # specs drawn per family in the per-family tests


def _specs(name: str, n: int = DRAWS, seed: int = 7) -> list[TaskSpec]:
    rng = random.Random(f"test:{seed}:{name}")
    return [FAMILIES[name](rng) for _ in range(n)]


def _run(reference: str, entry: str, args: list):
    ns: dict = {}
    exec(compile(reference, "<reference>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns[entry](*json.loads(json.dumps(args)))


def _is_edge_value(v) -> bool:
    """An empty input, a single element, zero, a negative number, or a string/list holding one of those."""
    if v in ([], "", 0, {}) or (isinstance(v, int) and not isinstance(v, bool) and v < 0):
        return True
    if isinstance(v, (list, str)) and len(v) == 1:
        return True
    return isinstance(v, list) and any(_is_edge_value(x) for x in v if isinstance(x, (list, int)))


def test_registry_has_at_least_15_families_over_many_topics():
    assert len(FAMILIES) >= 15
    topics = {f.topic for f in FAMILIES.values()}
    assert {"string", "list", "dict", "parsing", "arithmetic", "recursion", "sorting", "date", "interval",
            "bit manipulation", "matrix", "set"} <= topics
    for f in FAMILIES.values():
        assert 0.0 <= f.base_difficulty <= 0.7, f.name


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_references_run_on_their_inputs_and_return_json(name):
    for s in _specs(name):
        assert s.family == name
        assert s.signature.startswith(f"def {s.entry_point}(") and "->" in s.signature
        reference = mutants.normalise(s.reference)
        tree = ast.parse(reference)
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert all(a.name in ("datetime",) for n in imports for a in n.names), "standard library only"
        assert len(s.edge_inputs) >= 4 and len(s.random_inputs) >= 6
        for args in s.edge_inputs + s.random_inputs:
            assert isinstance(args, list)
            assert json.loads(json.dumps(args)) == args, f"{name}: arguments must survive JSON: {args!r}"
            out = _run(reference, s.entry_point, args)
            assert json.loads(json.dumps(out)) == out, f"{name}: {out!r} is not JSON"
            assert not isinstance(out, float), f"{name}: floats are not allowed in expected values"
        assert 0.0 <= s.difficulty <= 1.0
        assert s.description and s.description == " ".join(s.description.split())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_edge_inputs_hold_edge_cases(name):
    for s in _specs(name, n=4):
        # an edge value, or a degenerate range (every argument equal: an empty or one-day span)
        degenerate = [len(args) > 1 and len(set(map(str, args))) == 1 for args in s.edge_inputs]
        edgy = [any(_is_edge_value(a) for a in args) for args in s.edge_inputs]
        assert any(edgy) or any(degenerate), f"{name}: no empty/single/zero/negative input in {s.edge_inputs}"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_is_parametric_distinct_params_give_distinct_tasks(name):
    specs = _specs(name, n=40)
    by_desc = {s.description: s for s in specs}
    assert len(by_desc) >= 12, f"{name}: only {len(by_desc)} distinct tasks in 40 draws"
    # different descriptions come from different parameters and give different reference code
    params = {json.dumps(s.params, sort_keys=True) for s in by_desc.values()}
    assert len(params) == len(by_desc)
    codes = {mutants.normalise(s.reference) for s in by_desc.values()}
    assert len(codes) >= 0.8 * len(by_desc)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_variants_apply_once_and_change_the_code(name):
    n_variants = 0
    for s in _specs(name):
        reference = mutants.normalise(s.reference)
        for v in s.variants:
            assert v.kind in CANDIDATE_KINDS and v.kind != "reference"
            code = mutants.apply_variant(s.reference, v.old, v.new, where=name)
            assert code != reference, f"{name}: variant {v.note!r} changes nothing"
            n_variants += 1
    if name not in ("matrix", "bits"):  # those two have variants only for some operations
        assert n_variants > 0, f"{name}: no hand-written variant in {DRAWS} draws"


def test_a_variant_that_matches_twice_is_a_clear_error():
    with pytest.raises(mutants.MutationError, match="occurs 2 times"):
        mutants.apply_variant("def f(x):\n    return x + 1 + 1\n", "+ 1", "- 1", where="fam")
    with pytest.raises(mutants.MutationError, match="occurs 0 times"):
        mutants.apply_variant("def f(x):\n    return x\n", "y", "z", where="fam")


def test_same_seed_same_specs_and_another_seed_other_specs():
    for name in ("rpn", "matrix", "weekday_count"):
        a = [s.description for s in _specs(name, n=5, seed=1)]
        assert a == [s.description for s in _specs(name, n=5, seed=1)]
        assert a != [s.description for s in _specs(name, n=5, seed=2)]


def test_registering_a_family_twice_or_building_an_unregistered_one_fails():
    existing = next(iter(FAMILIES))
    with pytest.raises(FamilyError, match="registered twice"):
        family(existing, topic="x", base=0.1)(lambda rng: None)
    with pytest.raises(FamilyError, match="unregistered family"):
        spec("no_such_family", {}, "d", "f", "def f() -> int", "def f():\n    return 1\n", [[]], [[]], 0.0)
