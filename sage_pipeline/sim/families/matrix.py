"""Matrix family: block sums, diagonals, spirals, rotations, threshold counts and peaks on grids."""

from __future__ import annotations

import random

from sage_pipeline.sim.families.base import Variant, choose, family, ints, spec

GRID = "grid: list[list[int]]"
ROT_CW = "[list(r) for r in zip(*g[::-1])]"
ROT_CCW = "[list(r) for r in zip(*g)][::-1]"
ROT_180 = "[row[::-1] for row in g[::-1]]"
MIRROR = "[row[::-1] for row in g]"
# cw spiral from a corner = cw spiral from the top-left of the grid rotated so that corner is top-left
CORNER_ROTATION = {"top-left": None, "top-right": ROT_CCW, "bottom-right": ROT_180, "bottom-left": ROT_CW}
MIRRORED = {"top-left": "top-right", "top-right": "top-left", "bottom-left": "bottom-right",
            "bottom-right": "bottom-left"}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("s" if count != 1 else "")


def _block(rng: random.Random):
    k, w = choose(rng, [(a, b) for a in (1, 2, 3) for b in (1, 2, 3) if (a, b) != (1, 1)])
    want_max = rng.random() < 0.5
    code = (f"def block_sum({GRID}) -> int:\n"
            "    rows = len(grid)\n"
            "    cols = len(grid[0]) if grid else 0\n"
            f"    if rows < {k} or cols < {w}:\n"
            "        return 0\n"
            "    best = None\n"
            f"    for i in range(rows - {k} + 1):\n"
            f"        for j in range(cols - {w} + 1):\n"
            f"            total = sum(grid[i + a][j + b] for a in range({k}) for b in range({w}))\n"
            f"            if best is None or total {'>' if want_max else '<'} best:\n"
            "                best = total\n"
            "    return best\n")
    desc = (f"`grid` is a rectangular matrix of integers (a list of rows). Return the "
            f"{'largest' if want_max else 'smallest'} sum of a block of {_n(k, 'consecutive row')} by "
            f"{_n(w, 'consecutive column')}, or 0 when the grid has fewer than {_n(k, 'row')} or "
            f"{_n(w, 'column')}.")
    variants = [Variant("missed_edge_case", "    best = None\n", "    best = 0\n",
                        "the best sum starts at 0 instead of the first block")]
    return "block_sum", "int", code, desc, {"op": "block", "k": k, "w": w, "max": want_max}, variants, 0.1


def _diagonal(rng: random.Random):
    off = rng.randint(-2, 2)
    anti = rng.random() < 0.5
    j = f"len(row) - 1 - i - {off}" if anti else f"i + {off}"
    code = (f"def diagonal_sum({GRID}) -> int:\n"
            "    total = 0\n"
            "    for i, row in enumerate(grid):\n"
            f"        j = {j}\n"
            "        if 0 <= j < len(row):\n"
            "            total += row[j]\n"
            "    return total\n")
    cell = f"row i, column (number of columns - 1 - i - {off})" if anti else f"row i, column i + {off}"
    desc = (f"`grid` is a rectangular matrix of integers (a list of rows, rows and columns numbered from 0). "
            f"Return the sum of the cells at {cell}, over every row i for which that column exists.")
    variants = [Variant("missed_edge_case", "if 0 <= j < len(row):", "if j < len(row):",
                        "negative columns wrap around to the end of the row")]
    return "diagonal_sum", "int", code, desc, {"op": "diagonal", "offset": off, "anti": anti}, variants, 0.05


def _spiral(rng: random.Random):
    corner = choose(rng, list(CORNER_ROTATION))
    clockwise = rng.random() < 0.5
    steps = [] if clockwise else [MIRROR]
    rotation = CORNER_ROTATION[corner if clockwise else MIRRORED[corner]]
    if rotation:
        steps.append(rotation)
    lines = [f"def spiral({GRID}) -> list[int]:", "    g = [list(row) for row in grid]"]
    lines += [f"    g = {s}" for s in steps]
    lines += ["    out = []", "    while g and g[0]:", "        out.extend(g.pop(0))",
              f"        g = {ROT_CCW}",
              "    return out"]
    code = "\n".join(lines) + "\n"
    way = "clockwise" if clockwise else "counter-clockwise"
    desc = ("`grid` is a rectangular matrix of integers (a list of rows). Return its elements in spiral "
            f"order, starting at the {corner} corner and going {way} around the border, then inwards ring "
            "by ring.")
    return "spiral", "list[int]", code, desc, {"op": "spiral", "corner": corner, "cw": clockwise}, [], 0.15


def _rotate(rng: random.Random):
    k = rng.randint(1, 3)
    flip = choose(rng, ["none", "horizontal", "vertical"])
    lines = [f"def transform({GRID}) -> list[list[int]]:", "    g = [list(row) for row in grid]",
             f"    for _ in range({k}):", f"        g = {ROT_CW}"]
    if flip == "horizontal":
        lines.append(f"    g = {MIRROR}")
    elif flip == "vertical":
        lines.append("    g = g[::-1]")
    lines.append("    return g")
    code = "\n".join(lines) + "\n"
    desc = ("`grid` is a rectangular matrix of integers (a list of rows). "
            f"Rotate it {90 * k} degrees clockwise"
            + {"none": "", "horizontal": ", then mirror it left-to-right (reverse each row)",
               "vertical": ", then flip it upside down (reverse the order of the rows)"}[flip]
            + ", and return the result as a list of rows (an empty grid gives []).")
    return "transform", "list[list[int]]", code, desc, {"op": "rotate", "k": k, "flip": flip}, [], 0.05


def _threshold(rng: random.Random):
    t = rng.randint(-5, 5)
    by_col = rng.random() < 0.5
    at_least = rng.random() < 0.5
    cmp = ">=" if at_least else "<="
    if by_col:
        code = (f"def count_cells({GRID}) -> list[int]:\n"
                "    cols = len(grid[0]) if grid else 0\n"
                f"    return [sum(1 for row in grid if row[j] {cmp} {t}) for j in range(cols)]\n")
    else:
        code = (f"def count_cells({GRID}) -> list[int]:\n"
                f"    return [sum(1 for x in row if x {cmp} {t}) for row in grid]\n")
    desc = ("`grid` is a rectangular matrix of integers (a list of rows). For each "
            f"{'column' if by_col else 'row'}, in order, count its cells that are at "
            f"{'least' if at_least else 'most'} {t}; return the list of counts.")
    params = {"op": "threshold", "t": t, "columns": by_col, "at_least": at_least}
    return "count_cells", "list[int]", code, desc, params, [], 0.0


def _peaks(rng: random.Random):
    eight = rng.random() < 0.5
    strict = rng.random() < 0.5
    nbrs = [(-1, 0), (1, 0), (0, -1), (0, 1)] + ([(-1, -1), (-1, 1), (1, -1), (1, 1)] if eight else [])
    code = (f"def count_peaks({GRID}) -> int:\n"
            "    rows = len(grid)\n"
            "    count = 0\n"
            "    for i in range(rows):\n"
            "        for j in range(len(grid[i])):\n"
            "            ok = True\n"
            f"            for di, dj in {nbrs!r}:\n"
            "                a, b = i + di, j + dj\n"
            "                if 0 <= a < rows and 0 <= b < len(grid[a]) and "
            f"grid[a][b] {'>=' if strict else '>'} grid[i][j]:\n"
            "                    ok = False\n"
            "            if ok:\n"
            "                count += 1\n"
            "    return count\n")
    desc = ("`grid` is a rectangular matrix of integers (a list of rows). Count the cells that are "
            f"{'strictly greater than' if strict else 'greater than or equal to'} each of their "
            f"{'8' if eight else '4'} neighbours ({'including' if eight else 'not'} diagonal ones); cells on "
            "the border only have the neighbours that exist.")
    variants = [Variant("missed_edge_case", "if 0 <= a < rows and 0 <= b < len(grid[a])",
                        "if a < rows and b < len(grid[a])", "negative indices wrap around at the border")]
    return "count_peaks", "int", code, desc, {"op": "peaks", "eight": eight, "strict": strict}, variants, 0.12


OPS = {"block": (_block, 16), "diagonal": (_diagonal, 10), "spiral": (_spiral, 8), "rotate": (_rotate, 9),
       "threshold": (_threshold, 44), "peaks": (_peaks, 4)}


@family("matrix", topic="matrix", base=0.35)
def matrix(rng: random.Random):
    op = rng.choices(list(OPS), [w for _, w in OPS.values()])[0]
    name, ret, code, desc, params, variants, effect = OPS[op][0](rng)

    def grid(r: int, c: int) -> list[list[int]]:
        return [ints(rng, c, -9, 9) for _ in range(r)]

    edge = [[[]], [[[]]], [[[5]]], [[[1, 2, 3]]], [[[1], [2], [3]]], [[[-1, -2], [-3, -4]]],
            [[[2, 2, 2], [2, 2, 2], [2, 2, 2]]]]
    rand = [[grid(rng.randint(1, 5), rng.randint(1, 5))] for _ in range(8)]
    return spec("matrix", params, desc, name, f"def {name}({GRID}) -> {ret}", code, edge, rand, effect,
                variants)
