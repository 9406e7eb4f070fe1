"""Dict and set families: grouping pairs by key, set algebra with filters, nested lists (recursion)."""

from __future__ import annotations

import random

from sage_pipeline.sim.families.base import Variant, choose, family, ints, spec

KEYS = ["a", "b", "c", "A", "B", "x", "id"]


@family("group_by", topic="dict", base=0.25)
def group_by(rng: random.Random):
    agg = choose(rng, ["sum", "max", "min", "count", "first", "last", "spread"])
    filt = choose(rng, ["none", "above", "even", "odd"])
    t = rng.randint(-5, 5)
    fold = rng.random() < 0.5
    lines = ["def group(pairs: list[list]) -> dict[str, int]:", "    out = {}"]
    if agg == "spread":
        lines.append("    low = {}")
    lines.append("    for key, value in pairs:")
    if fold:
        lines.append("        key = key.lower()")
    cond = {"none": None, "above": f"value <= {t}", "even": "value % 2 != 0", "odd": "value % 2 == 0"}[filt]
    if cond:
        lines += [f"        if {cond}:", "            continue"]
    body = {"sum": ["out[key] = out.get(key, 0) + value"],
            "count": ["out[key] = out.get(key, 0) + 1"],
            "max": ["if key not in out or value > out[key]:", "    out[key] = value"],
            "min": ["if key not in out or value < out[key]:", "    out[key] = value"],
            "first": ["if key not in out:", "    out[key] = value"],
            "last": ["out[key] = value"],
            "spread": ["out[key] = max(out.get(key, value), value)",
                       "low[key] = min(low.get(key, value), value)"]}
    lines += ["        " + s for s in body[agg]]
    spread = "    return {k: v - low[k] for k, v in out.items()}"
    lines.append(spread if agg == "spread" else "    return out")
    code = "\n".join(lines) + "\n"
    what = {"sum": "the sum of its values", "count": "how many values it has", "max": "its largest value",
            "min": "its smallest value", "first": "its first value", "last": "its last value",
            "spread": "its largest value minus its smallest value"}[agg]
    keep = {"none": "", "above": f" Only pairs whose value is greater than {t} count.",
            "even": " Only pairs with an even value count.",
            "odd": " Only pairs with an odd value count."}[filt]
    desc = ("`pairs` is a list of [key, value] pairs (a string and an integer). Return a dict from each key"
            + (" (lower-cased, so 'A' and 'a' are the same key)" if fold else " (case-sensitive)")
            + f" to {what}.{keep} Keys without a counted pair do not appear.")
    variants = []
    if fold:
        variants.append(Variant("missed_edge_case", "        key = key.lower()\n", "", "keys are not folded"))
    if agg in ("max", "min"):
        op = ">" if agg == "max" else "<"
        variants.append(Variant("missed_edge_case", f"if key not in out or value {op} out[key]:",
                                f"if value {op} out.get(key, 0):", "a missing key counts as 0"))
    if agg in ("sum", "count", "spread"):
        variants.append(Variant("exception", "out.get(key, 0)" if agg != "spread" else "out.get(key, value)",
                                "out[key]", "reads a key before it exists"))

    def pairs(n: int) -> list[list]:
        return [[rng.choice(KEYS), rng.randint(-9, 9)] for _ in range(n)]

    edge = [[[]], [[["a", 1]]], [[["a", -3], ["A", 4], ["a", 5]]], [[["b", t], ["b", t + 1], ["b", t - 1]]],
            [[["x", 0], ["x", 0]]]]
    rand = [[pairs(rng.randint(1, 10))] for _ in range(8)]
    effects = (0.05 * fold + 0.05 * (filt != "none") + 0.08 * (agg == "spread")
               + 0.03 * (agg in ("max", "min")))
    params = {"agg": agg, "filter": filt, "t": t if filt == "above" else None, "fold": fold}
    return spec("group_by", params, desc, "group", "def group(pairs: list[list]) -> dict[str, int]", code,
                edge, rand, effects, variants)


@family("set_algebra", topic="set", base=0.15)
def set_algebra(rng: random.Random):
    op = choose(rng, ["&", "|", "-", "^"])
    filt = choose(rng, ["none", "mod", "above"])
    m = rng.randint(2, 5)
    r = rng.randrange(m)
    t = rng.randint(-5, 5)
    desc_order = rng.random() < 0.5
    cond = {"none": "", "mod": f" if x % {m} == {r}", "above": f" if x > {t}"}[filt]
    code = ("def combine(a: list[int], b: list[int]) -> list[int]:\n"
            f"    result = set(a) {op} set(b)\n"
            f"    return sorted((x for x in result{cond}), reverse={desc_order})\n")
    what = {"&": "in both `a` and `b`", "|": "in `a` or `b` (or both)", "-": "in `a` but not in `b`",
            "^": "in exactly one of `a` and `b`"}[op]
    keep = {"none": "", "mod": f" that leave remainder {r} when divided by {m} (Python's %)",
            "above": f" greater than {t}"}[filt]
    desc = (f"Return the distinct integers{keep} that are {what}, sorted in "
            f"{'descending' if desc_order else 'ascending'} order.")
    dup_version = {"&": "[x for x in a if x in b]", "|": "a + b", "-": "[x for x in a if x not in b]",
                   "^": "[x for x in a if x not in b] + [x for x in b if x not in a]"}[op]
    variants = [Variant("missed_edge_case", f"set(a) {op} set(b)", dup_version, "duplicates are kept")]
    edge = [[[], []], [[1], []], [[], [2]], [[3, 3, 1], [1, 1, 4]], [[-4, -2, 0, 2], [-2, 2, 6]],
            [[5, 6, 7], [5, 6, 7]], [[2, 2, -3, -3, 5, 5, 8, 8], [5, 5, 7, 7, -1, -1]]]
    rand = [[ints(rng, rng.randint(0, 9), -8, 8), ints(rng, rng.randint(0, 9), -8, 8)] for _ in range(8)]
    effects = 0.06 * (op in "-^") + 0.05 * (filt != "none") + 0.02 * desc_order
    params = {"op": op, "filter": filt, "m": m if filt == "mod" else None, "r": r if filt == "mod" else None,
              "t": t if filt == "above" else None, "descending": desc_order}
    return spec("set_algebra", params, desc, "combine",
                "def combine(a: list[int], b: list[int]) -> list[int]",
                code, edge, rand, effects, variants)


@family("nested_lists", topic="recursion", base=0.4)
def nested_lists(rng: random.Random):
    op = rng.choices(["weighted", "alternating", "max_depth", "flatten", "count_deep"], [3, 1, 1, 2, 4])[0]
    variants = []
    if op == "weighted":
        p = rng.randint(1, 3)
        start = rng.randint(0, 2)
        which = choose(rng, ["all", "positive", "negative"])
        branch = {"all": "else:", "positive": "elif x > 0:", "negative": "elif x < 0:"}[which]
        name, ret = "weighted_sum", "int"
        code = ("def weighted_sum(items: list) -> int:\n"
                f"    return _walk(items, {start})\n\n\n"
                "def _walk(items: list, depth: int) -> int:\n"
                "    total = 0\n"
                "    for x in items:\n"
                "        if isinstance(x, list):\n"
                "            total += _walk(x, depth + 1)\n"
                f"        {branch}\n"
                f"            total += x * depth ** {p}\n"
                "    return total\n")
        desc = (f"`items` is a list whose elements are integers or (nested) lists of the same kind. The "
                f"top-level list is at depth {start}, a list inside it at depth {start + 1}, and so on. "
                f"Return the sum over all {'' if which == 'all' else which + ' '}integers of the integer "
                f"times its depth raised to the power {p}.")
        params = {"op": op, "p": p, "start": start, "which": which}
    elif op == "alternating":
        neg_top = rng.random() < 0.5
        name, ret = "alternating_sum", "int"
        code = ("def alternating_sum(items: list) -> int:\n"
                f"    return _walk(items, {-1 if neg_top else 1})\n\n\n"
                "def _walk(items: list, sign: int) -> int:\n"
                "    total = 0\n"
                "    for x in items:\n"
                "        if isinstance(x, list):\n"
                "            total += _walk(x, -sign)\n"
                "        else:\n"
                "            total += sign * x\n"
                "    return total\n")
        desc = ("`items` is a list whose elements are integers or (nested) lists of the same kind. Integers "
                f"in the top-level list count {'negatively' if neg_top else 'positively'}, integers one "
                "level deeper the opposite way, and so on alternating. Return the signed sum.")
        params = {"op": op, "neg_top": neg_top}
    elif op == "max_depth":
        count_empty = rng.random() < 0.5
        name, ret = "max_depth", "int"
        code = ("def max_depth(items: list) -> int:\n"
                "    return _depth(items, 1)\n\n\n"
                "def _depth(items: list, depth: int) -> int:\n"
                f"    best = {'depth' if count_empty else '0'}\n"
                "    for x in items:\n"
                "        if isinstance(x, list):\n"
                "            best = max(best, _depth(x, depth + 1))\n"
                "        else:\n"
                "            best = max(best, depth)\n"
                "    return best\n")
        desc = ("`items` is a list whose elements are integers or (nested) lists of the same kind; the "
                "top-level list is at depth 1. Return the depth of the deepest "
                + ("list (empty lists count)" if count_empty else "integer (0 if there is no integer)") + ".")
        params = {"op": op, "count_empty": count_empty}
    elif op == "flatten":
        k = rng.randint(1, 4)
        drop_empty = rng.random() < 0.5
        name, ret = "flatten", "list"
        code = ("def flatten(items: list) -> list:\n"
                f"    return _flat(items, {k})\n\n\n"
                "def _flat(items: list, levels: int) -> list:\n"
                "    out = []\n"
                "    for x in items:\n"
                "        if isinstance(x, list) and levels > 0:\n"
                "            out.extend(_flat(x, levels - 1))\n"
                + ("        elif x == []:\n            continue\n" if drop_empty else "")
                + "        else:\n"
                "            out.append(x)\n"
                "    return out\n")
        desc = ("`items` is a list whose elements are integers or (nested) lists of the same kind. Remove up "
                f"to {k} level{'s' if k > 1 else ''} of nesting: lists nested deeper than that stay lists. "
                "Keep the order of the elements"
                + (", and leave out every empty list that would be an element of the result." if drop_empty
                   else "."))
        variants.append(Variant("missed_edge_case", "isinstance(x, list) and levels > 0",
                                "isinstance(x, list)",
                                "flattens every level"))
        params = {"op": op, "k": k, "drop_empty": drop_empty}
    else:
        t = rng.randint(-3, 5)
        min_depth = rng.randint(1, 4)
        above = rng.random() < 0.5
        name, ret = "count_deep", "int"
        code = ("def count_deep(items: list) -> int:\n"
                "    return _count(items, 1)\n\n\n"
                "def _count(items: list, depth: int) -> int:\n"
                "    n = 0\n"
                "    for x in items:\n"
                "        if isinstance(x, list):\n"
                "            n += _count(x, depth + 1)\n"
                f"        elif depth >= {min_depth} and x {'>' if above else '<'} {t}:\n"
                "            n += 1\n"
                "    return n\n")
        desc = ("`items` is a list whose elements are integers or (nested) lists of the same kind; the "
                f"top-level list is at depth 1. Count the integers {'greater' if above else 'less'} than {t} "
                f"that sit at depth {min_depth} or deeper.")
        params = {"op": op, "t": t, "min_depth": min_depth, "above": above}

    def nested(depth: int) -> list:
        out = []
        for _ in range(rng.randint(0, 4)):
            if depth > 0 and rng.random() < 0.35:
                out.append(nested(depth - 1))
            else:
                out.append(rng.randint(-9, 9))
        return out

    edge = [[[]], [[[]]], [[5]], [[-2, [3, [-4]]]], [[[[[[1]]]]]], [[1, [], [2, []]]]]
    rand = [[nested(4)] for _ in range(8)]
    effects = {"weighted": 0.05, "alternating": 0.05, "max_depth": 0.08, "flatten": 0.1,
               "count_deep": 0.06}[op]
    return spec("nested_lists", params, desc, name, f"def {name}(items: list) -> {ret}", code, edge, rand,
                effects, variants)
