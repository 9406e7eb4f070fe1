"""Mutants: each generic AST transform does what its kind says, never touches what would make a loop hang
unless it is an infinite_loop mutant, and every mutant really differs from the reference."""

from __future__ import annotations

import ast
import random

import pytest

from sage_pipeline.sim import mutants
from sage_pipeline.sim.mutants import Mutant, apply_site, choose_mutants, find_sites, normalise

REF = normalise('''
def score(xs: list[int], bonus: dict) -> int:
    if not xs:
        return -1
    total = 0
    for x in xs:
        if x < 0:
            continue
        total += x * 2 + bonus.get(x, 0)
    i = 0
    while i < len(xs):
        total -= xs[i] % 3
        i += 1
    return max(total, len(xs[1:]))
''')


def _fn(code: str):
    ns: dict = {}
    exec(compile(code, "<mutant>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns["score"]


def _mutants(kind: str) -> list[str]:
    return [apply_site(REF, s) for s in find_sites(REF, "score")[kind]]


def _while(code: str) -> ast.While:
    return next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.While))


def test_every_kind_has_sites_and_every_mutant_differs_from_the_reference():
    sites = find_sites(REF, "score")
    for kind in mutants.WRONG_KINDS:
        assert sites[kind], f"no {kind} site"
        for s in sites[kind]:
            code = apply_site(REF, s)
            assert ast.dump(ast.parse(code)) != ast.dump(ast.parse(REF)), f"{kind} {s.note} changes nothing"
            compile(code, "<mutant>", "exec")


def test_off_by_one_moves_boundaries_and_constants():
    codes = _mutants("off_by_one")
    assert any("if x <= 0:" in c for c in codes)  # boundary comparison
    assert any("total = 1" in c for c in codes) and any("total = -1" in c for c in codes)  # constant +-1
    assert any("xs[2:]" in c for c in codes)  # slice bound
    f_ref = _fn(REF)
    assert any(_fn(c)([0, 3, 4], {}) != f_ref([0, 3, 4], {}) for c in codes if "while" in c and "i += 1" in c)


def test_wrong_operator_swaps_operators_and_calls():
    codes = _mutants("wrong_operator")
    assert any("x * 2 - bonus" in c for c in codes)
    assert any("x + 2 + bonus" in c for c in codes)
    assert any("return min(total" in c for c in codes)
    assert any("if x > 0:" in c for c in codes)
    assert any("if xs:" in c for c in codes)  # dropped `not`


def test_missed_edge_case_drops_a_guard_and_then_fails_on_the_edge():
    codes = _mutants("missed_edge_case")
    dropped = [c for c in codes if "if not xs" not in c]
    assert dropped
    assert _fn(REF)([], {}) == -1
    assert _fn(dropped[0])([], {}) != -1


def test_exception_mutants_raise_on_edge_inputs():
    codes = _mutants("exception")
    keyerr = next(c for c in codes if "bonus[x]" in c)
    with pytest.raises(KeyError):
        _fn(keyerr)([1, 2], {})
    asserted = next(c for c in codes if "assert len(xs) > 0" in c)
    with pytest.raises(AssertionError):
        _fn(asserted)([], {})
    assert _fn(asserted)([1, 2], {}) == _fn(REF)([1, 2], {})


def test_non_loop_mutants_never_touch_a_while_test_or_its_update():
    ref_loop = _while(REF)
    for kind in ("off_by_one", "wrong_operator", "missed_edge_case", "exception", "wrong_type"):
        for code in _mutants(kind):
            loop = _while(code)
            assert ast.dump(loop.test) == ast.dump(ref_loop.test), f"{kind} changed the loop test"
            assert "i += 1" in ast.unparse(loop), f"{kind} dropped the loop update"


def test_without_loop_protection_plain_mutations_reach_the_loop_test():
    ref_test = ast.dump(_while(REF).test)
    unprotected = [apply_site(REF, s) for s in find_sites(REF, "score", protect_loops=False)["off_by_one"]]
    assert any(ast.dump(_while(c).test) != ref_test for c in unprotected)


def test_infinite_loop_mutants_drop_the_update_or_skip_it_with_continue():
    codes = _mutants("infinite_loop")
    assert any("i += 1" not in c for c in codes)  # the update of the while loop is gone
    rewritten = [c for c in codes if c.count("while") == 2]
    assert rewritten, "the for loop with `continue` was not rewritten"
    loop = next(n for n in ast.walk(ast.parse(rewritten[0]))
                if isinstance(n, ast.While) and "items" in ast.unparse(n.test))
    assert ast.unparse(loop.body[-1]) == "pos += 1"  # after the `continue`: a skipped element never advances
    assert any(isinstance(n, ast.Continue) for n in ast.walk(loop))
    # where no element takes the `continue`, the rewrite computes what the reference does (it is faithful)
    assert _fn(rewritten[0])([1, 5, 2], {1: 3}) == _fn(REF)([1, 5, 2], {1: 3})


def test_memory_blowup_allocates_first_and_wrong_type_wraps_returns():
    for code in _mutants("memory_blowup"):
        entry = ast.parse(code).body[0]
        first = ast.unparse(entry.body[0])
        assert "10 ** 10" in first or "<< 40" in first or first.startswith("history = [repr(xs)]")
    (wrong_type,) = _mutants("wrong_type")
    out = _fn(wrong_type)([1, 2], {})
    assert isinstance(out, str) and out == str(_fn(REF)([1, 2], {}))
    assert _fn(wrong_type)([], {}) == "-1"


def test_wrong_type_of_a_string_function_returns_a_list():
    ref = normalise("def up(s: str) -> str:\n    return s.upper()\n")
    (site,) = find_sites(ref, "up")["wrong_type"]
    ns: dict = {}
    exec(apply_site(ref, site), ns)  # noqa: S102 - generated references and mutants, no hanging ones
    assert ns["up"]("ab") == ["A", "B"]


def test_choose_mutants_is_deterministic_distinct_and_honours_forced_exclude_and_variants():
    variant = Mutant("missed_edge_case", normalise(REF.replace("if x < 0:", "if x < -5:")), "hand-written")
    a = choose_mutants(REF, "score", random.Random(3), n=5, forced=["memory_blowup", "infinite_loop"],
                       variants=[variant])
    b = choose_mutants(REF, "score", random.Random(3), n=5, forced=["memory_blowup", "infinite_loop"],
                       variants=[variant])
    assert [m.code for m in a] == [m.code for m in b]
    assert [m.kind for m in a[:2]] == ["memory_blowup", "infinite_loop"] and len(a) == 5
    assert len({m.code for m in a} | {REF}) == 6
    assert len({m.kind for m in a}) == 5  # the drawn kinds differ while fresh kinds remain
    again = choose_mutants(REF, "score", random.Random(3), n=5, exclude=[m.code for m in a])
    assert not {m.code for m in again} & {m.code for m in a}
    picked = [choose_mutants(REF, "score", random.Random(s), n=5, variants=[variant]) for s in range(12)]
    assert any(m.code == variant.code for ms in picked for m in ms), "the variant is never chosen"


def test_choose_mutants_returns_fewer_when_the_reference_has_few_sites():
    ref = normalise("def one() -> str:\n    return 'x'\n")
    out = choose_mutants(ref, "one", random.Random(0), n=4)
    assert [m.kind for m in out] == ["wrong_type"]


def test_a_reference_without_its_entry_point_is_a_clear_error():
    with pytest.raises(mutants.MutationError, match="no top-level function 'missing'"):
        find_sites(REF, "missing")
