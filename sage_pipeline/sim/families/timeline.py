"""Interval and date families: merging intervals, counting weekdays between ISO dates."""

from __future__ import annotations

import datetime
import random

from sage_pipeline.sim.families.base import Variant, choose, family, spec

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


@family("intervals", topic="interval", base=0.4)
def intervals(rng: random.Random):
    as_length = rng.random() < 0.5
    gap = rng.randint(-1, 3)
    min_len = rng.randint(0, 3)
    result = choose(rng, ["merged", "covered", "count", "longest"])
    if as_length:
        spans = f"sorted([s, s + n] for s, n in intervals if n >= {min_len})" if min_len else \
            "sorted([s, s + n] for s, n in intervals)"
    else:
        spans = f"sorted([s, e] for s, e in intervals if e - s >= {min_len})" if min_len else \
            "sorted([s, e] for s, e in intervals)"
    ret = {"merged": "list[list[int]]", "covered": "int", "count": "int", "longest": "int"}[result]
    final = {"merged": "merged", "covered": "sum(e - s for s, e in merged)", "count": "len(merged)",
             "longest": "max((e - s for s, e in merged), default=0)"}[result]
    code = (f"def merge(intervals: list[list[int]]) -> {ret}:\n"
            f"    spans = {spans}\n"
            "    merged = []\n"
            "    for s, e in spans:\n"
            f"        if merged and s - merged[-1][1] {'<' if gap < 0 else '<='} {max(gap, 0)}:\n"
            "            merged[-1][1] = max(merged[-1][1], e)\n"
            "        else:\n"
            "            merged.append([s, e])\n"
            f"    return {final}\n")
    shape = "[start, length] (length >= 0)" if as_length else "[start, end] (end >= start)"
    when = {-1: "overlap (share more than an endpoint)",
            0: "overlap or touch (the next starts where the previous ends, or earlier)"}.get(
        gap, f"overlap, touch or are separated by a gap of at most {gap}")
    what = {"merged": "the merged intervals as [start, end] lists, sorted by start",
            "covered": "the total length covered by the merged intervals",
            "count": "the number of merged intervals",
            "longest": "the length of the longest merged interval (0 if there is none)"}[result]
    desc = (f"`intervals` is a list of intervals, each {shape}, in any order. "
            + (f"First drop intervals shorter than {min_len}. " if min_len else "")
            + f"Merge intervals that {when}, repeatedly, and return {what}.")
    variants = [Variant("missed_edge_case", "merged[-1][1] = max(merged[-1][1], e)", "merged[-1][1] = e",
                        "an interval inside the previous one shortens it"),
                Variant("missed_edge_case", f"    spans = {spans}\n",
                        f"    spans = {spans.replace('sorted(', 'list(', 1)}\n", "input assumed sorted")]

    def interval() -> list[int]:
        s = rng.randint(-10, 30)
        n = rng.randint(0, 8)
        return [s, n] if as_length else [s, s + n]

    def pair(s: int, e: int) -> list[int]:
        return [s, e - s] if as_length else [s, e]

    edge = [[[]], [[pair(1, 4)]], [[pair(0, 10), pair(2, 3)]], [[pair(5, 7), pair(1, 3)]],
            [[pair(0, 2), pair(2, 4)]], [[pair(0, 2), pair(3, 5), pair(9, 9)]], [[pair(-5, -1), pair(-3, 0)]]]
    rand = [[[interval() for _ in range(rng.randint(1, 7))]] for _ in range(8)]
    effects = 0.05 * as_length + 0.05 * (gap > 0) + 0.05 * bool(min_len) + 0.03 * (result != "merged")
    params = {"as_length": as_length, "gap": gap, "min_len": min_len, "result": result}
    return spec("intervals", params, desc, "merge", f"def merge(intervals: list[list[int]]) -> {ret}", code,
                edge, rand, effects, variants)


@family("weekday_count", topic="date", base=0.35)
def weekday_count(rng: random.Random):
    days = tuple(sorted(rng.sample(range(7), rng.randint(1, 6))))
    inclusive = rng.random() < 0.5
    reversed_mode = choose(rng, ["swap", "zero"])
    holidays = rng.random() < 0.4
    lines = ["import datetime", "", "",
             "def count_days(start: str, end: str) -> int:",
             "    day = datetime.date.fromisoformat(start)",
             "    last = datetime.date.fromisoformat(end)",
             "    if day > last:",
             "        day, last = last, day" if reversed_mode == "swap" else "        return 0",
             "    count = 0",
             f"    while day {'<=' if inclusive else '<'} last:",
             f"        if day.weekday() in {days!r}"
             + (" and (day.month, day.day) not in ((1, 1), (12, 25)):" if holidays else ":"),
             "            count += 1",
             "        day += datetime.timedelta(days=1)",
             "    return count"]
    code = "\n".join(lines) + "\n"
    names = ", ".join(WEEKDAYS[d] for d in days)
    desc = (f"`start` and `end` are ISO dates ('YYYY-MM-DD'). Count the days from `start` up to `end` "
            f"({'both included' if inclusive else 'end excluded'}) that fall on {names}"
            + (", not counting 1 January and 25 December" if holidays else "")
            + ". If `start` is after `end`, "
            + ("swap them first." if reversed_mode == "swap" else "return 0."))
    variants = []
    if reversed_mode == "swap":
        variants.append(Variant("missed_edge_case", "    if day > last:\n        day, last = last, day\n", "",
                                "reversed dates give 0"))
    if holidays:
        variants.append(Variant("missed_edge_case", " and (day.month, day.day) not in ((1, 1), (12, 25))", "",
                                "holidays are counted"))
    if inclusive:
        variants.append(Variant("exception", "    while day <= last:",
                                "    while day < last.replace(day=last.day + 1):",
                                "the day after `end` built by hand: ValueError at the end of a month"))
    else:
        variants.append(Variant("exception", "    while day < last:",
                                "    while day <= last.replace(day=last.day - 1):",
                                "the day before `end` built by hand: ValueError on the 1st of a month"))

    def date(lo: datetime.date, span: int) -> str:
        return (lo + datetime.timedelta(days=rng.randint(0, span))).isoformat()

    base = datetime.date(2023, 11, 1)
    edge = [["2024-03-05", "2024-03-05"], ["2024-02-28", "2024-03-01"], ["2023-12-24", "2024-01-02"],
            ["2024-01-10", "2024-01-03"], ["2024-01-01", "2024-01-08"], ["2023-12-31", "2024-12-31"]]
    rand = [[date(base, 400), date(base, 400)] for _ in range(8)]
    effects = 0.04 * holidays + 0.04 * (reversed_mode == "swap") + 0.03 * inclusive + 0.01 * len(days)
    params = {"days": list(days), "inclusive": inclusive, "reversed": reversed_mode, "holidays": holidays}
    return spec("weekday_count", params, desc, "count_days", "def count_days(start: str, end: str) -> int",
                code, edge, rand, effects, variants)
