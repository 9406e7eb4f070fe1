"""String families: Caesar shifts, run-length encoding, longest runs, word counts."""

from __future__ import annotations

import random

from sage_pipeline.sim.families.base import LETTERS, PUNCT, Variant, choose, family, runs, spec, text


@family("caesar_shift", topic="string", base=0.15)
def caesar_shift(rng: random.Random):
    k = rng.randint(1, 25)
    backward = rng.random() < 0.5
    upper = rng.random() < 0.5
    digits = rng.random() < 0.5
    shift = -k if backward else k
    branches = [('    if "a" <= ch <= "z":\n'
                 f'        out.append(chr((ord(ch) - 97 + {shift}) % 26 + 97))\n')]
    if upper:
        branches.append('    elif "A" <= ch <= "Z":\n'
                        f'        out.append(chr((ord(ch) - 65 + {shift}) % 26 + 65))\n')
    if digits:
        branches.append('    elif "0" <= ch <= "9":\n'
                        f'        out.append(chr((ord(ch) - 48 + {shift}) % 10 + 48))\n')
    code = ("def shift_text(s: str) -> str:\n"
            "    out = []\n"
            "    for ch in s:\n"
            + "".join("    " + line + "\n" for b in branches for line in b.rstrip("\n").split("\n"))
            + "        else:\n"
              "            out.append(ch)\n"
              '    return "".join(out)\n')
    direction = "backward" if backward else "forward"
    desc = (f"Return `s` with every lower-case ASCII letter shifted {k} places {direction} in the "
            "alphabet, wrapping around between 'z' and 'a'. "
            + ("Upper-case ASCII letters shift the same way and stay upper-case. " if upper
               else "Upper-case letters are left unchanged. ")
            + (f"Each digit is shifted {k} places {direction} too, wrapping around between '9' and '0'. "
               if digits else "")
            + "Every other character is kept as it is.")
    variants = [Variant("missed_edge_case", "% 26 + 97", "+ 97", "no wrap-around at the alphabet's end")]
    if upper:
        variants.append(Variant("missed_edge_case", f"(ord(ch) - 65 + {shift}) % 26 + 65",
                                f"(ord(ch.lower()) - 97 + {shift}) % 26 + 97", "upper case comes out lower"))
    alphabet = LETTERS + LETTERS.upper() + "0123456789 ,.!-"
    edge = [[""], ["a"], ["z"], ["Z"], ["9"], ["xyz XYZ 0129!"], ["Hello, World 2024"]]
    rand = [[text(rng, alphabet, 1, 24)] for _ in range(8)]
    effects = 0.08 * upper + 0.08 * digits + 0.04 * backward
    return spec("caesar_shift", {"k": k, "backward": backward, "upper": upper, "digits": digits}, desc,
                "shift_text", "def shift_text(s: str) -> str", code, edge, rand, effects, variants)


@family("run_length", topic="string", base=0.35)
def run_length(rng: random.Random):
    count_first = rng.random() < 0.5
    omit_single = rng.random() < 0.5
    fold = rng.random() < 0.5
    max_run = choose(rng, [None, None, None, 2, 3, 4, 5, 6, 7, 8, 9])
    sep = choose(rng, ["", ",", "-", " ", "|"])
    low = ".lower()" if fold else ""
    cap = f" and j - i < {max_run}" if max_run else ""
    piece = "str(n) + ch" if count_first else "ch + str(n)"
    if omit_single:
        piece = f"ch if n == 1 else {piece}"
    code = ("def rle_encode(s: str) -> str:\n"
            "    parts = []\n"
            "    i = 0\n"
            "    while i < len(s):\n"
            "        j = i\n"
            f"        while j < len(s) and s[j]{low} == s[i]{low}{cap}:\n"
            "            j += 1\n"
            "        n = j - i\n"
            f"        ch = s[i]{low}\n"
            f"        parts.append({piece})\n"
            "        i = j\n"
            f"    return {sep!r}.join(parts)\n")
    example = "'3a'" if count_first else "'a3'"
    desc = ("Run-length encode `s`: split it into maximal runs of the same character"
            + (" (letters compared case-insensitively, each run written with its lower-case letter)" if fold
               else " (case-sensitive)")
            + ". "
            + (f"A run longer than {max_run} characters is cut into runs of {max_run}, the last one "
               "holding the rest. " if max_run else "")
            + f"Write each run as its length {'followed by' if count_first else 'after'} the character "
              f"(e.g. {example})"
            + (", except that a run of length 1 is written as the bare character" if omit_single else "")
            + ". Join the runs with " + (f"{sep!r}" if sep else "nothing") + "; the empty string encodes "
            "to the empty string.")
    variants = []
    if max_run:
        variants.append(Variant("missed_edge_case", cap, "", "long runs are not cut"))
    if fold:
        variants.append(Variant("missed_edge_case", "s[j].lower() == s[i].lower()", "s[j] == s[i]",
                                "case folding forgotten when comparing"))
    if omit_single:
        variants.append(Variant("missed_edge_case", "ch if n == 1 else ", "",
                                "length-1 runs keep their count"))
    alphabet = "aab" + ("AB" if fold else "c")
    edge = [[""], ["a"], ["z" * 11], ["aAaAbB"], ["abc"], ["aaabccddd"]]
    rand = [[runs(rng, alphabet, rng.randint(1, 7), 6)] for _ in range(8)]
    effects = 0.06 * omit_single + 0.08 * fold + 0.1 * bool(max_run) + 0.03 * bool(sep)
    params = {"count_first": count_first, "omit_single": omit_single, "fold": fold, "max_run": max_run,
              "sep": sep}
    return spec("run_length", params, desc, "rle_encode", "def rle_encode(s: str) -> str", code, edge, rand,
                effects, variants)


@family("longest_run", topic="string", base=0.1)
def longest_run(rng: random.Random):
    allowed = "".join(sorted(rng.sample(LETTERS, rng.randint(2, 6))))
    fold = rng.random() < 0.5
    min_len = choose(rng, [1, 1, 2, 3])
    low = ".lower()" if fold else ""
    keep = "max(best, cur)" if min_len == 1 else f"max(best, cur) if cur >= {min_len} else best"
    code = ("def longest_run(s: str) -> int:\n"
            "    best = 0\n"
            "    cur = 0\n"
            f"    for ch in s{low}:\n"
            f"        if ch in {allowed!r}:\n"
            "            cur += 1\n"
            "        else:\n"
            f"            best = {keep}\n"
            "            cur = 0\n"
            f"    return {keep}\n")
    letters = ", ".join(repr(c) for c in allowed)
    desc = (f"Return the length of the longest contiguous stretch of `s` made only of the letters {letters}"
            + (" (in either case)" if fold else " (lower case only: upper-case letters break a stretch)")
            + (f". Stretches shorter than {min_len} do not count" if min_len > 1 else "")
            + ". Return 0 when there is no such stretch.")
    variants = [Variant("missed_edge_case", f"    return {keep}\n", "    return best\n",
                        "a stretch that runs to the end of the string is never counted")]
    if fold:
        variants.append(Variant("missed_edge_case", f"for ch in s{low}:", "for ch in s:",
                                "upper-case letters are not folded"))
    pool = allowed + allowed.upper() + "xyz- "
    edge = [[""], [allowed[0]], [allowed * 3], [allowed.upper()], ["-" * 5], [f"-{allowed[0]}-"]]
    rand = [[text(rng, pool, 0, 30)] for _ in range(8)]
    effects = 0.06 * fold + 0.08 * (min_len > 1) + 0.01 * len(allowed)
    return spec("longest_run", {"allowed": allowed, "fold": fold, "min_len": min_len}, desc, "longest_run",
                "def longest_run(s: str) -> int", code, edge, rand, effects, variants)


STOPWORDS = ["the", "a", "an", "and", "of", "to", "in", "is"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it", "of", "in", "is", "an",
         "apple", "tree", "sun", "moon", "go", "be"]


@family("word_counts", topic="dict", base=0.25)
def word_counts(rng: random.Random):
    min_len = rng.randint(1, 4)
    fold = rng.random() < 0.5
    strip = rng.random() < 0.5
    stop = tuple(sorted(rng.sample(STOPWORDS, rng.randint(0, 3))))
    min_count = choose(rng, [1, 1, 2, 3])
    lines = ["def word_counts(text: str) -> dict[str, int]:",
             "    counts = {}",
             "    for word in text.split():"]
    if fold:
        lines.append("        word = word.lower()")
    if strip:
        lines.append(f"        word = word.strip({PUNCT!r})")
    cond = f"len(word) < {min_len}" + (f" or word in {stop!r}" if stop else "")
    lines += [f"        if {cond}:",
              "            continue",
              "        counts[word] = counts.get(word, 0) + 1"]
    lines.append(f"    return {{w: c for w, c in counts.items() if c >= {min_count}}}" if min_count > 1
                 else "    return counts")
    code = "\n".join(lines) + "\n"
    desc = ("Split `text` on whitespace into words"
            + (", lower-case each word" if fold else " (keep their case)")
            + (f", strip the characters {PUNCT!r} from both ends of each word" if strip else "")
            + f". Then skip words shorter than {min_len} characters"
            + (f" and the stop words {', '.join(repr(w) for w in stop)}" if stop else "")
            + ". Return a dict from each remaining word to how many times it occurs"
            + (f", keeping only words that occur at least {min_count} times" if min_count > 1 else "")
            + ".")
    variants = []
    if min_count > 1:
        variants.append(Variant("missed_edge_case", lines[-1] + "\n", "    return counts\n",
                                "the minimum count is not applied"))
    if strip:
        variants.append(Variant("missed_edge_case", f"word.strip({PUNCT!r})", "word.strip('.')",
                                "only full stops are stripped"))
    if fold:
        variants.append(Variant("missed_edge_case", "        word = word.lower()\n", "",
                                "case is not folded"))

    def sentence() -> str:
        out = []
        for _ in range(rng.randint(0, 14)):
            w = rng.choice(WORDS)
            if rng.random() < 0.2:
                w = w.capitalize()
            if rng.random() < 0.2:
                w += rng.choice(PUNCT)
            out.append(w)
        return " ".join(out)

    edge = [[""], ["   "], ["apple"], ["The the THE. the!"], ["!!! ... ?"], ["go go go go"]]
    rand = [[sentence()] for _ in range(8)]
    effects = 0.05 * fold + 0.07 * strip + 0.03 * len(stop) + 0.06 * (min_count > 1)
    params = {"min_len": min_len, "fold": fold, "strip": strip, "stop": list(stop), "min_count": min_count}
    return spec("word_counts", params, desc, "word_counts", "def word_counts(text: str) -> dict[str, int]",
                code, edge, rand, effects, variants)
