"""Parsing families: key=value strings, bracket structure, reverse Polish notation."""

from __future__ import annotations

import random

from sage_pipeline.sim.families.base import Variant, choose, family, spec


@family("parse_pairs", topic="parsing", base=0.35)
def parse_pairs(rng: random.Random):
    pair_sep = choose(rng, [";", ",", "|", "&"])
    kv_sep = choose(rng, ["=", ":", "->"])
    dup = choose(rng, ["sum", "last", "first", "max"])
    fold = rng.random() < 0.5
    merge = {"sum": "out[key] + value", "last": "value", "max": "max(out[key], value)"}
    lines = ["def _is_int(raw: str) -> bool:",
             "    body = raw[1:] if raw[:1] in ('+', '-') else raw",
             "    return body.isascii() and body.isdigit()",
             "",
             "",
             "def parse_pairs(text: str) -> dict[str, int]:",
             "    out = {}",
             f"    for piece in text.split({pair_sep!r}):",
             f"        if {kv_sep!r} not in piece:",
             "            continue",
             f"        key, _, raw = piece.partition({kv_sep!r})",
             "        key = key.strip()" + (".lower()" if fold else ""),
             "        raw = raw.strip()",
             "        if not key or not _is_int(raw):",
             "            continue",
             "        value = int(raw)"]
    if dup == "first":
        lines += ["        if key not in out:", "            out[key] = value"]
    else:
        lines += ["        if key in out:", f"            out[key] = {merge[dup]}", "        else:",
                  "            out[key] = value"]
    lines.append("    return out")
    code = "\n".join(lines) + "\n"
    dup_words = {"sum": "their values are added up", "last": "the last value wins",
                 "first": "the first value wins", "max": "the largest value wins"}[dup]
    desc = (f"`text` holds pairs separated by {pair_sep!r}; each pair is a key and an integer value "
            f"separated by {kv_sep!r}. Return a dict from key to value. Strip spaces around keys and values"
            + (" and lower-case the keys" if fold else " (keys are case-sensitive)")
            + f". Skip pieces without {kv_sep!r}, with an empty key, or whose value is not an integer "
              f"(an optional sign followed by ASCII digits). When a key repeats, {dup_words}.")
    variants = [Variant("exception", "        if not key or not _is_int(raw):\n",
                        "        if not key:\n", "int() on a value that is not an integer raises")]
    if fold:
        variants.append(Variant("missed_edge_case", "key.strip().lower()", "key.strip()", "keys not folded"))
    variants.append(Variant("missed_edge_case", "        raw = raw.strip()\n", "",
                            "spaces around the value make it invalid"))

    def pair() -> str:
        key = rng.choice(["a", "b", "id", "x", "Key", "A"])
        val = str(rng.randint(-20, 30))
        if rng.random() < 0.2:
            val = rng.choice(["x1", "", "3.5", "+7", " 4 "])
        if rng.random() < 0.15:
            return key + val
        return key + rng.choice(["", " "]) + kv_sep + rng.choice(["", " "]) + val

    ps, kv = pair_sep, kv_sep
    edge = [[""], [ps * 2], [f"a{kv}1"], [f"a{kv}1{ps}A{kv}2{ps}a{kv}5"], [f"a{kv}x{ps}b{kv}2"], [f"{kv}5"],
            [f" a {kv} -3 {ps} b{kv}+4 "]]
    rand = [[ps.join(pair() for _ in range(rng.randint(1, 6)))] for _ in range(8)]
    effects = 0.05 * fold + 0.06 * (dup != "last") + 0.03 * (len(kv_sep) > 1)
    params = {"pair_sep": pair_sep, "kv_sep": kv_sep, "dup": dup, "fold": fold}
    return spec("parse_pairs", params, desc, "parse_pairs", "def parse_pairs(text: str) -> dict[str, int]",
                code, edge, rand, effects, variants)


BRACKETS = [("(", ")"), ("[", "]"), ("{", "}"), ("<", ">")]


@family("brackets", topic="parsing", base=0.4)
def brackets(rng: random.Random):
    pairs = [BRACKETS[i] for i in sorted(rng.sample(range(4), rng.randint(1, 4)))]
    others = choose(rng, ["ignore", "invalid"])
    result = choose(rng, ["depth", "groups", "pairs"])
    bad = choose(rng, ["-1", "None"])
    opens = "".join(o for o, _ in pairs)
    closing = {c: o for o, c in pairs}
    counter = {"depth": "best", "groups": "groups", "pairs": "pairs"}[result]
    ret = "int | None" if bad == "None" else "int"
    lines = [f"def check_brackets(s: str) -> {ret}:",
             f"    closing = {closing!r}",
             "    stack = []",
             f"    {counter} = 0",
             "    for ch in s:",
             f"        if ch in {opens!r}:",
             "            stack.append(ch)"]
    if result == "depth":
        lines.append("            best = max(best, len(stack))")
    lines += ["        elif ch in closing:",
              "            if not stack or stack.pop() != closing[ch]:",
              f"                return {bad}"]
    if result == "groups":
        lines += ["            if not stack:", "                groups += 1"]
    elif result == "pairs":
        lines.append("            pairs += 1")
    if others == "invalid":
        lines += ["        else:", f"            return {bad}"]
    lines += ["    if stack:", f"        return {bad}", f"    return {counter}"]
    code = "\n".join(lines) + "\n"
    names = ", ".join(o + c for o, c in pairs)
    what = {"depth": "the maximum nesting depth (0 for a string without brackets)",
            "groups": "the number of top-level bracket groups (a group is an opening bracket at depth 0 "
                      "and everything up to its matching closing bracket)",
            "pairs": "the number of matched bracket pairs"}[result]
    desc = (f"The bracket pairs are {names}. "
            + ("Characters other than these brackets are ignored. " if others == "ignore"
               else "Any other character makes the string invalid. ")
            + f"If the brackets in `s` are balanced and properly nested, return {what}; otherwise "
              f"return {bad}.")
    o0, c0 = pairs[0]
    variants = [Variant("exception", "if not stack or stack.pop() != closing[ch]:",
                        "if stack.pop() != closing[ch]:",
                        "pop from an empty stack on a stray closing bracket"),
                Variant("missed_edge_case", f"    if stack:\n        return {bad}\n", "",
                        "unclosed brackets at the end are accepted")]
    if len(pairs) > 1:
        variants.append(Variant("missed_edge_case", "stack.pop() != closing[ch]", "stack.pop() is None",
                                "any closing bracket closes any opening bracket"))

    def balanced(depth: int) -> str:
        out = []
        for _ in range(rng.randint(0, 3)):
            o, c = rng.choice(pairs)
            inner = balanced(depth - 1) if depth > 0 else ""
            filler = rng.choice(["", "", "x", "1 "])
            out.append(o + filler + inner + c)
        return "".join(out)

    def sample() -> str:
        s = balanced(3)
        r = rng.random()
        if r < 0.2 and s:
            i = rng.randrange(len(s))
            s = s[:i] + s[i + 1:]
        elif r < 0.35:
            s = s + rng.choice(opens)
        elif r < 0.45:
            s = rng.choice([c for _, c in pairs]) + s
        return s

    edge = [[""], [o0], [c0], [o0 + c0], [o0 + o0 + c0 + c0 + o0 + c0], ["a" + o0 + "b" + c0 + "c"]]
    if len(pairs) > 1:
        o1, c1 = pairs[1]
        edge.append([o0 + o1 + c0 + c1])
    rand = [[sample()] for _ in range(8)]
    effects = 0.04 * len(pairs) + 0.06 * (result == "groups") + 0.03 * (others == "invalid")
    params = {"pairs": names, "others": others, "result": result, "bad": bad}
    return spec("brackets", params, desc, "check_brackets", lines[0].rstrip(":"), code, edge, rand, effects,
                variants)


OPS = ["+", "-", "*", "/", "%", "max"]


@family("rpn", topic="parsing", base=0.45)
def rpn(rng: random.Random):
    ops = sorted(rng.sample(OPS, rng.randint(2, 4)), key=OPS.index)
    trunc = "/" in ops and rng.random() < 0.5
    sep = choose(rng, [" ", ","])
    bad = choose(rng, ["None", "0"])
    impl = {"+": "a + b", "-": "a - b", "*": "a * b", "%": "a % b", "max": "max(a, b)",
            "/": "q if (a < 0) == (b < 0) else -q" if trunc else "a // b"}
    lines = ["def eval_rpn(expr: str) -> " + ("int | None" if bad == "None" else "int") + ":",
             "    stack = []",
             f"    for tok in expr.split({sep!r}):",
             "        if not tok:",
             "            continue",
             f"        if tok in {tuple(ops)!r}:",
             "            if len(stack) < 2:",
             f"                return {bad}",
             "            b = stack.pop()",
             "            a = stack.pop()"]
    if "/" in ops or "%" in ops:
        lines += [f"            if tok in {tuple(o for o in ops if o in '/%')!r} and b == 0:",
                  f"                return {bad}"]
    for i, op in enumerate(ops):
        lines.append(f"            {'if' if i == 0 else 'elif'} tok == {op!r}:")
        if op == "/" and trunc:
            lines.append("                q = abs(a) // abs(b)")
        lines.append(f"                stack.append({impl[op]})")
    lines += ["        else:", "            stack.append(int(tok))",
              "    if len(stack) != 1:", f"        return {bad}", "    return stack[0]"]
    code = "\n".join(lines) + "\n"
    meaning = {"+": "'+' adds", "-": "'-' subtracts", "*": "'*' multiplies",
               "/": "'/' divides rounding " + ("toward zero" if trunc else "down (floor division)"),
               "%": "'%' is Python's remainder a % b", "max": "'max' keeps the larger"}
    desc = (f"Evaluate the integer expression `expr` written in reverse Polish notation, tokens separated by "
            f"{sep!r} (empty tokens are skipped). Operators: " + ", ".join(meaning[o] for o in ops)
            + "; each pops b then a and pushes the result of `a op b`. Every other token is an integer "
            f"literal. Return {bad} if an operator lacks operands"
            + (", a division or remainder by zero" if ("/" in ops or "%" in ops) else "")
            + " or the expression does not leave exactly one value.")
    variants = [Variant("missed_edge_case",
                        f"    if len(stack) != 1:\n        return {bad}\n    return stack[0]",
                        "    return stack[-1]", "leftover values are not an error (and empty input raises)")]
    if trunc:
        variants.append(Variant("missed_edge_case", "q if (a < 0) == (b < 0) else -q", "a // b",
                                "floor division instead of truncation for negative quotients"))

    def expr(depth: int) -> list[str]:
        if depth == 0 or rng.random() < 0.3:
            return [str(rng.randint(-9, 12))]
        return expr(depth - 1) + expr(depth - 1) + [rng.choice(ops)]

    def sample() -> str:
        toks = expr(3)
        r = rng.random()
        if r < 0.12:
            toks.append(rng.choice(ops))
        elif r < 0.22:
            toks.insert(0, "4")
        return sep.join(toks)

    o = ops[0]
    edge = [[""], ["5"], ["-3"], [sep.join(["1", o])], [sep.join(["2", "3", "4", o])],
            [sep.join(["7", "2", o])]]
    if "/" in ops:
        edge += [[sep.join(["7", "0", "/"])], [sep.join(["-7", "2", "/"])]]
    rand = [[sample()] for _ in range(8)]
    effects = 0.03 * len(ops) + 0.08 * trunc + 0.04 * ("%" in ops)
    params = {"ops": ops, "trunc": trunc, "sep": sep, "bad": bad}
    return spec("rpn", params, desc, "eval_rpn", lines[0].rstrip(":"), code, edge, rand, effects, variants)
