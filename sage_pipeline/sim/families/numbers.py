"""Arithmetic and bit families: digit statistics, base conversion, linear recurrences, bit tricks."""

from __future__ import annotations

import random

from sage_pipeline.sim.families.base import Variant, choose, family, spec


@family("digit_stat", topic="arithmetic", base=0.2)
def digit_stat(rng: random.Random):
    base = rng.randint(2, 16)
    op = choose(rng, ["sum", "count", "alternating", "max", "product"])
    d = rng.randrange(base)
    negate = rng.random() < 0.5
    # what 0 (written as the single digit 0) gives, and the loop that computes the rest
    zero = {"sum": 0, "count": int(d == 0), "alternating": 0, "max": 0, "product": 1}[op]
    init = {"sum": "0", "count": "0", "alternating": "0", "max": "0", "product": "1"}[op]
    step = {"sum": ["total += digit"],
            "count": [f"if digit == {d}:", "    total += 1"],
            "alternating": ["total += sign_d * digit", "sign_d = -sign_d"],
            "max": ["total = max(total, digit)"],
            "product": ["if digit:", "    total *= digit"]}[op]
    lines = ["def digit_stat(n: int) -> int:"]
    if negate:
        lines.append("    sign = -1 if n < 0 else 1")
    lines += ["    n = abs(n)", "    if n == 0:", f"        return {zero}", f"    total = {init}"]
    if op == "alternating":
        lines.append("    sign_d = 1")
    lines += ["    while n > 0:", f"        digit = n % {base}"]
    lines += ["        " + s for s in step]
    lines += [f"        n //= {base}", "    return sign * total" if negate else "    return total"]
    code = "\n".join(lines) + "\n"
    what = {"sum": "the sum of the digits",
            "count": f"how many digits are equal to {d}",
            "alternating": "the alternating digit sum: the last digit minus the one before plus the one "
                           "before that, and so on",
            "max": "the largest digit",
            "product": "the product of the non-zero digits (1 if there are none)"}[op]
    desc = (f"Write the absolute value of the integer `n` in base {base} (0 is the single digit 0) and "
            f"return {what}" + (", negated when `n` is negative." if negate else "."))
    variants = []
    if negate:
        variants.append(Variant("missed_edge_case", "    return sign * total", "    return total",
                                "the sign of negative inputs is dropped"))
    variants.append(Variant("missed_edge_case", "    n = abs(n)\n", "",
                            "negative inputs are not made positive first"))
    edge = [[0], [1], [-1], [base - 1], [base], [base ** 3], [-(base ** 2) - 1], [d]]
    rand = [[rng.randint(-10 ** 6, 10 ** 6)] for _ in range(8)]
    effects = 0.08 * (op in ("alternating", "count")) + 0.05 * negate + 0.005 * base
    params = {"base": base, "op": op, "digit": d, "negate": negate}
    return spec("digit_stat", params, desc, "digit_stat", "def digit_stat(n: int) -> int", code, edge, rand,
                effects, variants)


@family("to_base", topic="arithmetic", base=0.25)
def to_base(rng: random.Random):
    base = rng.randint(2, 36)
    upper = rng.random() < 0.5 and base > 10
    width = choose(rng, [0, 0, 2, 4, 6, 8])
    prefix = choose(rng, ["", "", "0" + "xyzb"[rng.randrange(4)], "#"])
    alphabet = "0123456789" + ("ABCDEFGHIJKLMNOPQRSTUVWXYZ" if upper else "abcdefghijklmnopqrstuvwxyz")
    code = ("def to_base(n: int) -> str:\n"
            f"    digits = {alphabet[:base]!r}\n"
            "    if n == 0:\n"
            f"        return {prefix!r} + '0'" + (f".rjust({width}, '0')" if width else "") + "\n"
            "    sign = '-' if n < 0 else ''\n"
            "    n = abs(n)\n"
            "    out = []\n"
            "    while n > 0:\n"
            f"        out.append(digits[n % {base}])\n"
            f"        n //= {base}\n"
            "    body = ''.join(reversed(out))\n"
            f"    return sign + {prefix!r} + body" + (f".rjust({width}, '0')" if width else "") + "\n")
    desc = (f"Return the integer `n` written in base {base}"
            + (f" with the digits 0-9 then {'upper' if upper else 'lower'}-case letters" if base > 10 else "")
            + (f", left-padded with zeros to at least {width} digits" if width else "")
            + (f", the digits preceded by the prefix {prefix!r}" if prefix else "")
            + ". A negative number starts with '-'" + (" (before the prefix)" if prefix else "")
            + "; 0 is written as '0'" + (" (padded like any other number)" if width else "") + ".")
    variants = [Variant("missed_edge_case", "    n = abs(n)\n", "", "negative numbers come out empty")]
    if width:
        variants.append(Variant("missed_edge_case",
                                f"    return sign + {prefix!r} + body.rjust({width}, '0')",
                                f"    return (sign + {prefix!r} + body).rjust({width}, '0')",
                                "padding goes before the sign and prefix"))
    edge = [[0], [1], [-1], [base - 1], [base], [-base], [base ** 4 - 1]]
    rand = [[rng.randint(-10 ** 7, 10 ** 7)] for _ in range(8)]
    effects = 0.06 * bool(width) + 0.05 * bool(prefix) + 0.004 * base
    params = {"base": base, "upper": upper, "width": width, "prefix": prefix}
    return spec("to_base", params, desc, "to_base", "def to_base(n: int) -> str", code, edge, rand, effects,
                variants)


@family("recurrence", topic="arithmetic", base=0.3)
def recurrence(rng: random.Random):
    a = rng.randint(1, 3)
    b = choose(rng, [-2, -1, 1, 2, 3])
    c = rng.randint(0, 2)
    mod = choose(rng, [None, None, 97, 1000, 10 ** 9 + 7])
    f0, f1 = rng.randint(0, 3), rng.randint(0, 3)
    neg = choose(rng, ["0", "-1"])
    expr = f"{a} * cur + {b} * prev" + (f" + {c}" if c else "")
    if mod:
        expr = f"({expr}) % {mod}"
    code = ("def term(n: int) -> int:\n"
            "    if n < 0:\n"
            f"        return {neg}\n"
            "    if n == 0:\n"
            f"        return {f0}\n"
            f"    prev, cur = {f0}, {f1}\n"
            "    for _ in range(n - 1):\n"
            f"        prev, cur = cur, {expr}\n"
            "    return cur\n")
    rule = f"f(n) = {a}*f(n-1) {'+' if b > 0 else '-'} {abs(b)}*f(n-2)" + (f" + {c}" if c else "")
    desc = (f"The sequence f has f(0) = {f0}, f(1) = {f1} and {rule} for n >= 2"
            + (f", every term from f(2) on taken modulo {mod} (Python's %, never negative)" if mod else "")
            + f". Return f(n), or {neg} when n is negative.")
    variants = [Variant("missed_edge_case", f"    if n == 0:\n        return {f0}\n", "",
                        "f(0) comes out as f(1)")]
    edge = [[0], [1], [2], [3], [-1], [-5]]
    rand = [[rng.randint(4, 40)] for _ in range(7)]
    effects = 0.05 * (b < 0) + 0.05 * bool(c) + 0.07 * bool(mod)
    params = {"a": a, "b": b, "c": c, "mod": mod, "f0": f0, "f1": f1, "neg": neg}
    return spec("recurrence", params, desc, "term", "def term(n: int) -> int", code, edge, rand, effects,
                variants)


@family("bits", topic="bit manipulation", base=0.35)
def bits(rng: random.Random):
    op = choose(rng, ["masked_popcount", "reverse", "rotate", "gray_decode", "transitions"])
    width = rng.randint(4, 16)
    variants = []
    if op == "masked_popcount":
        mask = rng.randrange(1, 1 << width)
        code = ("def bit_op(x: int) -> int:\n"
                f"    x &= {mask}\n"
                "    count = 0\n"
                "    while x:\n"
                "        count += x & 1\n"
                "        x >>= 1\n"
                "    return count\n")
        desc = f"Return how many of the bits of the non-negative integer `x` set in the mask {mask} are 1."
        variants.append(Variant("missed_edge_case", f"    x &= {mask}\n", "", "the mask is ignored"))
        params = {"op": op, "mask": mask}
    elif op == "reverse":
        code = ("def bit_op(x: int) -> int:\n"
                "    out = 0\n"
                f"    for _ in range({width}):\n"
                "        out = (out << 1) | (x & 1)\n"
                "        x >>= 1\n"
                "    return out\n")
        desc = (f"Return the lowest {width} bits of the non-negative integer `x` in reverse order (bit 0 "
                f"becomes bit {width - 1}); higher bits of `x` are dropped.")
        params = {"op": op, "width": width}
    elif op == "rotate":
        r = rng.randint(1, width - 1)
        full = (1 << width) - 1
        code = ("def bit_op(x: int) -> int:\n"
                f"    x &= {full}\n"
                f"    return ((x << {r}) | (x >> {width - r})) & {full}\n")
        desc = (f"Keep the lowest {width} bits of the non-negative integer `x` and rotate them left by {r} "
                f"positions within that {width}-bit width (bits leaving the top come back at the bottom).")
        variants.append(Variant("missed_edge_case", f"    x &= {full}\n", "", "bits above the width leak in"))
        params = {"op": op, "width": width, "r": r}
    elif op == "gray_decode":
        code = ("def bit_op(x: int) -> int:\n"
                "    result = 0\n"
                "    while x:\n"
                "        result ^= x\n"
                "        x >>= 1\n"
                "    return result\n")
        desc = ("`x` is a non-negative integer in reflected binary Gray code. Return the integer it encodes "
                "(each output bit is the XOR of the input bits at and above its position).")
        params = {"op": op}
        width = 16
    else:
        code = ("def bit_op(x: int) -> int:\n"
                "    count = 0\n"
                f"    for i in range({width - 1}):\n"
                "        if (x >> i) & 1 != (x >> (i + 1)) & 1:\n"
                "            count += 1\n"
                "    return count\n")
        desc = (f"Look at the lowest {width} bits of the non-negative integer `x` (bit 0 to bit {width - 1}) "
                "and return how many neighbouring pairs of them differ.")
        params = {"op": op, "width": width}
    top = 1 << width
    edge = [[0], [1], [top - 1], [top], [top + 1], [1 << (width - 1)], [0b1010_1010_1010_1010_1]]
    rand = [[rng.randrange(0, 1 << 20)] for _ in range(8)]
    effects = {"masked_popcount": 0.0, "reverse": 0.05, "rotate": 0.1, "gray_decode": 0.12,
               "transitions": 0.05}[op] + 0.004 * width
    return spec("bits", params, desc, "bit_op", "def bit_op(x: int) -> int", code, edge, rand, effects,
                variants)
