"""What a task family is, and the registry every family module adds itself to.

A family is a function ``make(rng) -> TaskSpec`` that draws its parameters from ``rng``
and returns one task: a natural-language description, the signature, the reference
solution (a standalone module, standard library only), the inputs its tests run on (hand
picked edge cases first, then seeded random ones), a difficulty before the code-size
term, and hand-written wrong variants (``Variant``: a text substitution on the
reference) where a generic AST mutation cannot express the mistake, typically a missed
edge case. Different parameters give a different description, reference and tests.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field


class FamilyError(ValueError):
    """A family produced something unusable (a bug in the family, not in user input)."""


@dataclass(frozen=True)
class Variant:
    """A hand-written wrong candidate: replace ``old`` (exactly once) by ``new`` in the reference."""

    kind: str
    old: str
    new: str
    note: str


@dataclass(frozen=True)
class TaskSpec:
    family: str
    params: dict
    description: str  # what the function must do, in words (examples are added by tasks.py)
    entry_point: str
    signature: str  # "def f(xs: list[int]) -> int"
    reference: str  # module source; tasks.py normalises it with ast.unparse
    edge_inputs: list[list]  # argument lists: empty, single element, negatives, boundaries
    random_inputs: list[list]  # seeded random argument lists
    difficulty: float  # family base plus parameter effects, before the code-size term
    variants: tuple[Variant, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Family:
    name: str
    topic: str  # string, list, dict, parsing, arithmetic, recursion, ...
    base_difficulty: float
    make: Callable[[random.Random], TaskSpec]
    module: str  # where the family lives, for error messages

    def __call__(self, rng: random.Random) -> TaskSpec:
        return self.make(rng)


FAMILIES: dict[str, Family] = {}


def family(name: str, topic: str, base: float) -> Callable:
    """Register ``make`` as the family ``name`` (its module is named in error messages)."""

    def register(make: Callable[[random.Random], TaskSpec]) -> Callable[[random.Random], TaskSpec]:
        if name in FAMILIES:
            raise FamilyError(f"family {name!r} is registered twice ({make.__module__} and "
                              f"{FAMILIES[name].module})")
        FAMILIES[name] = Family(name=name, topic=topic, base_difficulty=base, make=make,
                                module=make.__module__)
        return make

    return register


def spec(fam: str, params: dict, description: str, entry_point: str, signature: str, reference: str,
         edge_inputs: list[list], random_inputs: list[list], effects: float,
         variants: list[Variant] | tuple[Variant, ...] = ()) -> TaskSpec:
    """A TaskSpec whose difficulty is the family base plus ``effects`` (parameter effects)."""
    if fam not in FAMILIES:
        raise FamilyError(f"spec() for unregistered family {fam!r}: decorate its make function with @family")
    base = FAMILIES[fam].base_difficulty
    return TaskSpec(family=fam, params=params, description=" ".join(description.split()),
                    entry_point=entry_point, signature=signature, reference=reference,
                    edge_inputs=edge_inputs, random_inputs=random_inputs,
                    difficulty=base + effects, variants=tuple(variants))


# ---------------------------------------------------------------- random input helpers

def ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def text(rng: random.Random, alphabet: str, lo: int, hi: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def runs(rng: random.Random, alphabet: str, n_runs: int, max_run: int) -> str:
    """A string made of runs of repeated characters (for run-length style tasks)."""
    return "".join(rng.choice(alphabet) * rng.randint(1, max_run) for _ in range(n_runs))


LETTERS = string.ascii_lowercase
PUNCT = ".,;:!?"


def choose(rng: random.Random, options: list | tuple):
    return options[rng.randrange(len(options))]


def quoted(s: str) -> str:
    """A string as the prompt shows it: Python's repr."""
    return repr(s)
