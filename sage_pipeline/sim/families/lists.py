"""List families: sliding windows, filtered aggregates, sorting records by keys, a ledger."""

from __future__ import annotations

import random

from sage_pipeline.sim.families.base import Variant, choose, family, ints, spec


@family("best_window", topic="list", base=0.3)
def best_window(rng: random.Random):
    k = rng.randint(2, 9)
    want_max = rng.random() < 0.5
    ret_index = rng.random() < 0.4
    short = choose(rng, ["-1", "None"] if ret_index else ["0", "-1", "None", "sum(xs)"])
    cmp = ">" if want_max else "<"
    lines = ["def best_window(xs: list[int]) -> " + ("int | None" if short == "None" else "int") + ":",
             f"    if len(xs) < {k}:",
             f"        return {short}",
             f"    best = cur = sum(xs[:{k}])"]
    if ret_index:
        lines.append("    best_i = 0")
    lines += [f"    for i in range({k}, len(xs)):",
              f"        cur += xs[i] - xs[i - {k}]",
              f"        if cur {cmp} best:",
              "            best = cur"]
    if ret_index:
        lines.append(f"            best_i = i - {k} + 1")
    lines.append("    return best_i" if ret_index else "    return best")
    code = "\n".join(lines) + "\n"
    which = "largest" if want_max else "smallest"
    short_words = {"0": "0", "-1": "-1", "None": "None", "sum(xs)": "the sum of all its elements"}[short]
    desc = ((f"Return the start index of the {k} consecutive elements of `xs` with the {which} sum "
             "(the earliest index when several windows tie)." if ret_index
             else f"Return the {which} sum of {k} consecutive elements of `xs`.")
            + f" If `xs` has fewer than {k} elements, return {short_words}.")
    variants = [Variant("missed_edge_case", f"best = cur = sum(xs[:{k}])",
                        f"cur = sum(xs[:{k}])\n    best = 0",
                        "the best sum starts at 0, wrong when every window sum is on the other side")]
    negatives = [-5, -2, -7, -1, -9, -4, -3, -8, -6, -2][:k + 2]
    edge = [[[]], [[5]], [[-3] * (k - 1)], [list(range(k))], [negatives], [[4] * (k + 3)], [[7, -7] * k]]
    rand = [[ints(rng, rng.randint(max(0, k - 2), k + 8), -20, 20)] for _ in range(8)]
    effects = 0.1 * ret_index + 0.05 * (short == "sum(xs)") + 0.01 * k
    params = {"k": k, "max": want_max, "index": ret_index, "short": short}
    return spec("best_window", params, desc, "best_window",
                lines[0].rstrip(":"), code, edge, rand, effects, variants)


@family("filtered_aggregate", topic="list", base=0.12)
def filtered_aggregate(rng: random.Random):
    kind = choose(rng, ["mod", "range", "above"])
    if kind == "mod":
        m = rng.randint(2, 9)
        r = rng.randrange(m)
        pred, words = f"x % {m} == {r}", (f"leave remainder {r} when divided by {m} (Python's %, so the "
                                          "remainder of a negative number is not negative)")
    elif kind == "range":
        lo = rng.randint(-10, 5)
        hi = lo + rng.randint(1, 15)
        pred, words = f"{lo} <= x <= {hi}", f"lie between {lo} and {hi} inclusive"
    else:
        t = rng.randint(-5, 10)
        odd = rng.randrange(2)
        pred, words = f"x > {t} and x % 2 == {odd}", f"are greater than {t} and {'odd' if odd else 'even'}"
    agg = choose(rng, ["count", "sum", "max", "min"])
    default = choose(rng, ["0", "-1", "None"]) if agg in ("max", "min") else None
    name = f"{agg}_matching"
    ret = "int | None" if default == "None" else "int"
    lines = [f"def {name}(xs: list[int]) -> {ret}:",
             f"    picked = [x for x in xs if {pred}]"]
    if default is not None:
        lines += ["    if not picked:", f"        return {default}"]
    lines.append({"count": "    return len(picked)", "sum": "    return sum(picked)",
                  "max": "    return max(picked)", "min": "    return min(picked)"}[agg])
    code = "\n".join(lines) + "\n"
    what = {"count": "how many there are", "sum": "their sum (0 if there are none)",
            "max": f"the largest of them, or {default} if there are none",
            "min": f"the smallest of them, or {default} if there are none"}[agg]
    desc = f"Consider the elements of `xs` that {words}. Return {what}."
    variants = []
    if kind == "mod" and r:
        variants.append(Variant("missed_edge_case", f"x % {m} == {r}", f"abs(x) % {m} == {r}",
                                "negative numbers take the remainder of their absolute value"))
    if kind == "range":
        variants.append(Variant("missed_edge_case", f"{lo} <= x <= {hi}", f"{lo} < x < {hi}",
                                "the endpoints are excluded"))
    edge = [[[]], [[0]], [[-7]], [[-9, -4, -1]], [list(range(-6, 7))]]
    if kind == "range":
        edge.append([[lo, hi, lo - 1, hi + 1]])
    rand = [[ints(rng, rng.randint(0, 12), -15, 15)] for _ in range(8)]
    effects = 0.08 * (kind != "range") + 0.06 * (default is not None) + 0.04 * (kind == "mod")
    params = {"predicate": pred, "agg": agg, "default": default}
    return spec("filtered_aggregate", params, desc, name, lines[0].rstrip(":"), code, edge, rand, effects,
                variants)


NAMES = ["ann", "bob", "cy", "dora", "eve", "finn", "gus", "hal", "ida", "jo", "kat", "liv", "max", "ned",
         "olga", "pia", "quin", "rosa", "sam", "tess", "ugo", "vera", "wes", "xia", "yuri", "zoe"]


@family("sort_records", topic="sorting", base=0.3)
def sort_records(rng: random.Random):
    fields = {"age": "r[1]", "score": "r[2]", "name length": "len(r[0])"}
    primary = choose(rng, list(fields))
    secondary = choose(rng, [f for f in fields if f != primary])
    p_desc, s_desc = rng.random() < 0.5, rng.random() < 0.5
    top = choose(rng, [None, None, 1, 2, 3, 5])
    p_key = ("-" if p_desc else "") + fields[primary]
    s_key = ("-" if s_desc else "") + fields[secondary]
    code = ("def rank_names(records: list[list]) -> list[str]:\n"
            f"    ordered = sorted(records, key=lambda r: ({p_key}, {s_key}, r[0]))\n"
            f"    return [r[0] for r in ordered]{f'[:{top}]' if top else ''}\n")
    desc = ("Each record is a list [name, age, score] (a string and two integers). Return the names "
            f"ordered by {primary} ({'descending' if p_desc else 'ascending'}), ties broken by {secondary} "
            f"({'descending' if s_desc else 'ascending'}) and then by name in alphabetical order"
            + (f"; return only the first {top} name{'s' if top > 1 else ''} (all of them if there are fewer)"
               if top else "")
            + ".")
    variants = [Variant("missed_edge_case", f"{s_key}, r[0])", f"{s_key})", "no final tie-break by name"),
                Variant("missed_edge_case", f"({p_key}, {s_key}, r[0])", f"({p_key}, r[0])",
                        "the secondary key is ignored")]

    def records(n: int) -> list[list]:
        return [[rng.choice(NAMES), rng.choice([20, 25, 30, 35, 40]), rng.randrange(0, 101, 10)]
                for _ in range(n)]

    edge = [[[]], [[["ann", 30, 50]]], [[["bob", 30, 50], ["amy", 30, 50], ["cal", 30, 50]]],
            [[["zed", 20, 10], ["al", 40, 90], ["kim", 20, 90], ["bo", 40, 10]]]]
    rand = [[records(rng.randint(2, 9))] for _ in range(8)]
    effects = 0.06 * (primary == "name length" or secondary == "name length") + 0.04 * (p_desc + s_desc) \
        + 0.05 * bool(top)
    params = {"primary": primary, "primary_desc": p_desc, "secondary": secondary, "secondary_desc": s_desc,
              "top": top}
    return spec("sort_records", params, desc, "rank_names",
                "def rank_names(records: list[list]) -> list[str]",
                code, edge, rand, effects, variants)


@family("ledger", topic="list", base=0.3)
def ledger(rng: random.Random):
    start = rng.randrange(0, 101, 10)
    floor = choose(rng, [f for f in (-50, -20, 0, 10) if f <= start])
    cap = choose(rng, [None, None, 150, 200, 250, 300])
    cap_mode = choose(rng, ["truncate", "reject"]) if cap else None
    lines = ["def settle(amounts: list[int]) -> list[int]:",
             f"    balance = {start}",
             "    rejected = 0",
             "    for a in amounts:",
             "        new = balance + a",
             f"        if new < {floor}:",
             "            rejected += 1",
             "            continue"]
    if cap_mode == "reject":
        lines += [f"        if new > {cap}:", "            rejected += 1", "            continue"]
    elif cap_mode == "truncate":
        lines += [f"        if new > {cap}:", f"            new = {cap}"]
    lines += ["        balance = new", "    return [balance, rejected]"]
    code = "\n".join(lines) + "\n"
    desc = (f"An account starts with balance {start}. Apply the transactions in `amounts` in order "
            "(positive amounts are deposits, negative ones withdrawals). A transaction that would take the "
            f"balance below {floor} is rejected and leaves the balance unchanged"
            + ({"reject": f"; so is one that would take it above {cap}",
                "truncate": f"; one that would take it above {cap} is applied but the balance is capped at "
                            f"{cap} (it is not counted as rejected)"}.get(cap_mode, ""))
            + ". Return [final balance, number of rejected transactions].")
    variants = []
    if cap_mode == "truncate":
        variants.append(Variant("missed_edge_case", f"        if new > {cap}:\n            new = {cap}\n", "",
                                "the cap is never applied"))
    variants.append(Variant("missed_edge_case", "        new = balance + a\n",
                            "        new = balance + a\n        balance = new\n",
                            "a rejected transaction still changes the balance"))
    edge = [[[]], [[0]], [[-1000]], [[floor - start]], [[floor - start - 1, 5]]]
    if cap:
        edge += [[[cap - start]], [[cap - start + 1, -3]]]
    rand = [[ints(rng, rng.randint(0, 12), -80, 90)] for _ in range(8)]
    effects = 0.08 * bool(cap) + 0.04 * (cap_mode == "truncate") + 0.03 * (floor != 0)
    params = {"start": start, "floor": floor, "cap": cap, "cap_mode": cap_mode}
    return spec("ledger", params, desc, "settle", "def settle(amounts: list[int]) -> list[int]", code, edge,
                rand, effects, variants)
