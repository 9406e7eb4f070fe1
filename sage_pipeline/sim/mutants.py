"""Realistic wrong candidates, made from a task's reference solution.

Generic mutations are AST transforms of the reference (``ast.parse`` -> change one node ->
``ast.unparse``), each of one kind of :data:`~sage_pipeline.sim.schema.CANDIDATE_KINDS`:

- ``off_by_one``: a boundary comparison ``<`` <-> ``<=``, ``>`` <-> ``>=``; an integer
  constant +-1; a ``range`` stop, a slice bound or an index +-1;
- ``wrong_operator``: ``+`` <-> ``-``, ``*`` -> ``+``, ``//`` <-> ``%``, ``&`` <-> ``|``,
  ``<<`` <-> ``>>``, ``==`` <-> ``!=``, ``<`` <-> ``>``, ``and`` <-> ``or``, ``min`` <->
  ``max``, a dropped unary minus or ``not``;
- ``missed_edge_case``: a guard clause dropped (an ``if`` that only returns, continues,
  breaks or raises);
- ``exception``: ``d.get(k, v)`` -> ``d[k]``, ``max(..., default=v)`` -> ``max(...)``, or an
  ``assert`` of a precondition the edge cases violate (an empty list, zero);
- ``infinite_loop``: the update of a ``while`` loop's variable dropped, or a ``for`` loop
  rewritten as an index ``while`` loop whose ``continue`` skips the increment;
- ``memory_blowup``: a lookup table or a buffer sized far past any memory limit, or a history of
  doubling buffers that grows into it;
- ``wrong_type``: every ``return`` of the entry point wrapped in ``str(...)`` (``list(...)``
  when it returns a string).

Family-specific mistakes that no generic transform expresses (most missed edge cases)
are hand-written :class:`~sage_pipeline.sim.families.base.Variant` substitutions, applied
by :func:`apply_variant`. Mutations that would make a loop never end are kept out of the
other kinds (they touch no ``while`` test or loop-variable update), so only
``infinite_loop`` candidates cost their timeout.

Whether a mutant is really wrong is decided by running it (``tasks.verify_tasks``): one
that passes every test is marked equivalent.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

WRONG_KINDS = ("off_by_one", "wrong_operator", "missed_edge_case", "exception", "infinite_loop",
               "memory_blowup", "wrong_type")
# kinds that end in their own time (no timeout, no memory limit): what alternates are drawn from
CHEAP_KINDS = ("off_by_one", "wrong_operator", "missed_edge_case", "exception", "wrong_type")


class MutationError(ValueError):
    """A mutation could not be applied (a bug in a family's variant or in a transform)."""


@dataclass(frozen=True)
class Mutant:
    kind: str
    code: str
    note: str  # what was changed, for people reading the tasks file


@dataclass(frozen=True)
class Site:
    kind: str
    index: int  # the node's position in ast.walk order of the reference
    action: str
    arg: object
    note: str
    specific: bool = True  # False for the generic fallbacks (the assert precondition)


def normalise(code: str) -> str:
    """The code as ``ast.unparse`` writes it: the form every candidate is stored in."""
    return ast.unparse(ast.parse(code))


def fingerprint(code: str) -> str:
    """Equal for codes with the same AST (``ast.unparse`` is canonical for a given tree)."""
    return normalise(code)


# ----------------------------------------------------------------------------- operators

BIN_SWAPS = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Add], ast.FloorDiv: [ast.Mod],
             ast.Mod: [ast.FloorDiv], ast.Pow: [ast.Mult], ast.BitAnd: [ast.BitOr], ast.BitOr: [ast.BitXor],
             ast.BitXor: [ast.BitOr], ast.LShift: [ast.RShift], ast.RShift: [ast.LShift]}
CMP_WRONG = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE,
             ast.GtE: ast.LtE, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
CMP_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
          ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Eq: "==",
          ast.NotEq: "!=", ast.Lt: "<", ast.Gt: ">", ast.LtE: "<=", ast.GtE: ">=", ast.In: "in",
          ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.And: "and", ast.Or: "or"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _entry(tree: ast.Module, entry_point: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            return node
    raise MutationError(f"the reference defines no top-level function {entry_point!r}")


def _loop_guarded(tree: ast.AST) -> set[int]:
    """ids of nodes whose mutation could make a ``while`` loop never end: its test and its updates."""
    out: set[int] = set()
    for w in ast.walk(tree):
        if not isinstance(w, ast.While):
            continue
        out |= {id(n) for n in ast.walk(w.test)}
        for stmt, _ in _loop_updates(w):
            out |= {id(n) for n in ast.walk(stmt)}
    return out


def _loop_updates(w: ast.While) -> list[tuple[ast.stmt, str]]:
    """Statements directly in a while body that move a variable its test reads."""
    tested = _names(w.test)
    found = []
    for stmt in w.body:
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in tested:
            found.append((stmt, stmt.target.id))
        elif isinstance(stmt, ast.Assign) and any(_names(t) & tested for t in stmt.targets):
            found.append((stmt, ", ".join(sorted(set().union(*(_names(t) for t in stmt.targets)) & tested))))
        elif isinstance(stmt, ast.Expr) and any(_method_on(c, tested) for c in ast.walk(stmt)):
            found.append((stmt, "the loop's collection"))
    return found


def _method_on(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` is a method call on one of ``names`` (``g.pop(0)``: it may move the loop)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in names)


def _direct_continue(body: list[ast.stmt]) -> bool:
    """Whether ``body`` has a ``continue`` that belongs to its own loop (not to a nested loop)."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Continue):
            return True
        if isinstance(node, (ast.For, ast.While, ast.FunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _is_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and not node.orelse and 1 <= len(node.body) <= 2
            and isinstance(node.body[-1], (ast.Return, ast.Continue, ast.Break, ast.Raise)))


def _param_kind(arg: ast.arg) -> str:
    ann = ast.unparse(arg.annotation) if arg.annotation is not None else ""
    if ann == "int":
        return "int"
    if ann.startswith(("list", "str", "dict")):
        return "sized"
    return ""


# ----------------------------------------------------------------------------- finding sites

def find_sites(reference: str, entry_point: str, protect_loops: bool = True) -> dict[str, list[Site]]:
    """Every generic mutation site of the reference, by kind.

    With ``protect_loops`` (the default) no site of a kind other than ``infinite_loop``
    touches a ``while`` test or a loop-variable update; without it (what plain mutation
    testing does, kept for the benchmark) any operator or constant may be mutated.
    """
    tree = ast.parse(reference)
    entry = _entry(tree, entry_point)
    guarded = _loop_guarded(tree) if protect_loops else set()
    nodes = list(ast.walk(tree))
    index = {id(n): i for i, n in enumerate(nodes)}
    sites: dict[str, list[Site]] = {k: [] for k in WRONG_KINDS}
    docstrings = {id(f.body[0].value) for f in ast.walk(tree)
                  if isinstance(f, ast.FunctionDef) and f.body and isinstance(f.body[0], ast.Expr)}

    def add(kind: str, i: int, action: str, arg: object, node: ast.AST, what: str, specific: bool = True):
        line = getattr(node, "lineno", 0)
        sites[kind].append(Site(kind, i, action, arg, f"line {line}: {what}", specific))

    for i, node in enumerate(nodes):
        safe = id(node) not in guarded
        if isinstance(node, ast.Compare) and safe:
            for j, op in enumerate(node.ops):
                if type(op) in CMP_BOUNDARY:
                    new = CMP_BOUNDARY[type(op)]
                    add("off_by_one", i, "cmp", (j, new.__name__), node,
                        f"`{SYMBOL[type(op)]}` -> `{SYMBOL[new]}`")
                if type(op) in CMP_WRONG:
                    new = CMP_WRONG[type(op)]
                    add("wrong_operator", i, "cmp", (j, new.__name__), node,
                        f"`{SYMBOL[type(op)]}` -> `{SYMBOL[new]}`")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and safe and type(node.op) in BIN_SWAPS:
            for new in BIN_SWAPS[type(node.op)]:
                add("wrong_operator", i, "binop", new.__name__, node,
                    f"`{SYMBOL[type(node.op)]}` -> `{SYMBOL[new]}`")
        elif isinstance(node, ast.BoolOp) and safe:
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            add("wrong_operator", i, "boolop", new.__name__, node,
                f"`{SYMBOL[type(node.op)]}` -> `{SYMBOL[new]}`")
        elif isinstance(node, ast.UnaryOp) and safe and isinstance(node.op, (ast.USub, ast.Not)) \
                and not isinstance(node.operand, ast.Constant):
            add("wrong_operator", i, "unwrap", None, node,
                f"`{'-' if isinstance(node.op, ast.USub) else 'not'}` dropped")
        elif isinstance(node, ast.Constant) and safe and type(node.value) is int \
                and id(node) not in docstrings:
            for delta in (1, -1):
                add("off_by_one", i, "const", delta, node, f"{node.value} -> {node.value + delta}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name == "range" and node.args and safe:
                for delta in (1, -1):
                    add("off_by_one", i, "range_stop", delta, node, f"range stop {delta:+d}")
            if name in ("min", "max") and safe:
                other = "max" if name == "min" else "min"
                add("wrong_operator", i, "rename_call", other, node, f"`{name}` -> `{other}`")
                if any(k.arg == "default" for k in node.keywords):
                    add("exception", i, "drop_default", None, node,
                        f"`{name}` without a default raises on empty input")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and len(node.args) == 2 and safe:
            add("exception", i, "get_subscript", None, node, "`.get(key, default)` -> `[key]`")
        elif isinstance(node, ast.Slice) and safe:
            for bound in ("lower", "upper"):
                if getattr(node, bound) is not None:
                    add("off_by_one", i, "slice", (bound, 1), node, f"slice {bound} bound +1")
        elif isinstance(node, ast.Subscript) and safe and isinstance(node.slice, ast.Name) \
                and isinstance(node.ctx, ast.Load):
            for delta in (1, -1):
                add("off_by_one", i, "index", delta, node, f"index `{node.slice.id}` {delta:+d}")
        elif _is_guard(node):
            add("missed_edge_case", i, "drop_stmt", None, node,
                f"guard `if {ast.unparse(node.test)}` dropped")
        elif isinstance(node, ast.While):
            for stmt, var in _loop_updates(node):
                add("infinite_loop", index[id(stmt)], "drop_stmt", None, stmt, f"the update of {var} dropped")
        elif isinstance(node, ast.For) and not node.orelse and _direct_continue(node.body) \
                and isinstance(node.target, (ast.Name, ast.Tuple)):
            add("infinite_loop", i, "for_to_while", None, node,
                "for loop rewritten as a while loop whose `continue` skips the increment")

    params = [a for a in entry.args.args if _param_kind(a)]
    if params:
        p = params[0]
        e = index[id(entry)]
        if _param_kind(p) == "int":
            pre = f"assert {p.arg} > 0, '{p.arg} must be positive'"
            size = f"(abs({p.arg}) + 1)"
        else:
            pre = f"assert len({p.arg}) > 0, '{p.arg} must not be empty'"
            size = f"(len({p.arg}) + 1)"
        add("exception", e, "prepend", pre, entry, f"asserts a precondition on `{p.arg}`", specific=False)
        # two fail at once at the memory limit; the growing one runs into it (and may cost its timeout)
        add("memory_blowup", e, "prepend", f"table = [0] * ({size} * 10 ** 10)", entry,
            "allocates a lookup table of 10**10 entries per input element")
        add("memory_blowup", e, "prepend", f"buffer = bytearray({size} << 40)", entry,
            "preallocates a terabyte buffer per input element")
        history = (f"history = [repr({p.arg})]\n"
                   "while len(history) < 10 ** 12:\n    history.append(history[-1] * 2)")
        add("memory_blowup", e, "prepend", history, entry, "keeps a history of doubling buffers")
    ret = ast.unparse(entry.returns) if entry.returns is not None else ""
    wrap = "list" if ret == "str" else "str"
    add("wrong_type", index[id(entry)], "wrap_returns", wrap, entry,
        f"returns `{wrap}(...)` of the right value")
    return sites


# ----------------------------------------------------------------------------- applying them

def _slot(tree: ast.AST, target: ast.AST) -> tuple[ast.AST, str, int | None]:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is target:
                return parent, field, None
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is target:
                        return parent, field, k
    raise MutationError(f"node {ast.dump(target)[:60]} has no parent")


def _replace(tree: ast.AST, target: ast.AST, new: ast.AST | list[ast.stmt] | None) -> None:
    parent, field, k = _slot(tree, target)
    if k is None:
        setattr(parent, field, new)
        return
    seq = getattr(parent, field)
    replacement = [] if new is None else (new if isinstance(new, list) else [new])
    seq[k:k + 1] = replacement
    if not seq and field == "body":
        seq.append(ast.Pass())


def _plus(node: ast.expr, delta: int) -> ast.expr:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + delta)
    return ast.BinOp(node, ast.Add() if delta > 0 else ast.Sub(), ast.Constant(abs(delta)))


def _fresh(tree: ast.AST, base: str) -> str:
    used = _names(tree) | {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    name = base
    while name in used:
        name += "_"
    return name


def _act_cmp(tree, node, arg):
    j, new = arg
    node.ops[j] = getattr(ast, new)()


def _act_binop(tree, node, arg):
    node.op = getattr(ast, arg)()


def _act_boolop(tree, node, arg):
    node.op = getattr(ast, arg)()


def _act_unwrap(tree, node, arg):
    _replace(tree, node, node.operand)


def _act_const(tree, node, arg):
    node.value = node.value + arg


def _act_range_stop(tree, node, arg):
    node.args[-1 if len(node.args) < 3 else 1] = _plus(node.args[-1 if len(node.args) < 3 else 1], arg)


def _act_slice(tree, node, arg):
    bound, delta = arg
    setattr(node, bound, _plus(getattr(node, bound), delta))


def _act_index(tree, node, arg):
    node.slice = _plus(node.slice, arg)


def _act_rename_call(tree, node, arg):
    node.func = ast.Name(arg, ast.Load())


def _act_drop_default(tree, node, arg):
    node.keywords = [k for k in node.keywords if k.arg != "default"]


def _act_get_subscript(tree, node, arg):
    _replace(tree, node, ast.Subscript(node.func.value, node.args[0], ast.Load()))


def _act_drop_stmt(tree, node, arg):
    _replace(tree, node, None)


def _act_prepend(tree, node, arg):
    node.body[0:0] = ast.parse(arg).body


def _act_wrap_returns(tree, node, arg):
    stack = list(node.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(n, ast.Return) and n.value is not None:
            n.value = ast.Call(ast.Name(arg, ast.Load()), [n.value], [])
        stack.extend(ast.iter_child_nodes(n))


def _act_for_to_while(tree, node, arg):
    items, pos = _fresh(tree, "items"), _fresh(tree, "pos")
    head = ast.parse(f"{items} = list({ast.unparse(node.iter)})\n{pos} = 0").body
    loop = ast.parse(f"while {pos} < len({items}):\n    {ast.unparse(node.target)} = {items}[{pos}]\n"
                     f"    {pos} += 1").body[0]
    loop.body[1:1] = node.body  # the increment stays last, so `continue` skips it
    _replace(tree, node, head + [loop])


ACTIONS: dict[str, Callable[[ast.AST, ast.AST, object], None]] = {
    "cmp": _act_cmp, "binop": _act_binop, "boolop": _act_boolop, "unwrap": _act_unwrap, "const": _act_const,
    "range_stop": _act_range_stop, "slice": _act_slice, "index": _act_index, "rename_call": _act_rename_call,
    "drop_default": _act_drop_default, "get_subscript": _act_get_subscript, "drop_stmt": _act_drop_stmt,
    "prepend": _act_prepend, "wrap_returns": _act_wrap_returns, "for_to_while": _act_for_to_while,
}


def apply_site(reference: str, site: Site) -> str:
    """The reference with one mutation applied, as ``ast.unparse`` writes it."""
    tree = ast.parse(reference)
    nodes = list(ast.walk(tree))
    if site.index >= len(nodes):
        raise MutationError(f"site {site.note} does not exist in this reference")
    ACTIONS[site.action](tree, nodes[site.index], site.arg)
    ast.fix_missing_locations(tree)
    code = ast.unparse(tree)
    compile(code, "<mutant>", "exec")
    return code


def apply_variant(reference: str, old: str, new: str, where: str = "") -> str:
    """A hand-written variant: ``old`` replaced by ``new`` in the raw reference, then normalised."""
    n = reference.count(old)
    if n != 1:
        raise MutationError(f"{where}: variant text {old!r} occurs {n} times in the reference (it must occur "
                            "exactly once; fix the family's Variant)")
    code = reference.replace(old, new)
    try:
        return normalise(code)
    except SyntaxError as e:
        raise MutationError(f"{where}: variant {old!r} -> {new!r} gives invalid Python ({e})") from e


# ----------------------------------------------------------------------------- choosing mutants

KIND_WEIGHTS = {"off_by_one": 1.0, "wrong_operator": 1.0, "missed_edge_case": 1.0, "exception": 0.7,
                "wrong_type": 0.5}


def choose_mutants(reference: str, entry_point: str, rng: random.Random, n: int,
                   forced: Iterable[str] = (), variants: Iterable[Mutant] = (),
                   exclude: Iterable[str] = (), kinds: Iterable[str] = CHEAP_KINDS,
                   sites: dict[str, list[Site]] | None = None) -> list[Mutant]:
    """Up to ``n`` distinct mutants: one of each ``forced`` kind first, then kinds drawn by weight.

    ``variants`` (hand-written, already normalised) are preferred over generic sites of
    their kind. Mutants whose AST equals the reference, another chosen mutant or a code in
    ``exclude`` are skipped. Fewer than ``n`` come back only when the reference has too few
    sites. ``reference`` must be normalised (as stored in a TaskRecord); ``sites`` saves
    finding them again.
    """
    seen = {reference} | {fingerprint(c) for c in exclude}
    sites = sites if sites is not None else find_sites(reference, entry_point)
    by_kind: dict[str, list] = {}
    for k in WRONG_KINDS:
        specific = [s for s in sites[k] if s.specific]
        generic = [s for s in sites[k] if not s.specific]
        rng.shuffle(specific)
        rng.shuffle(generic)
        own = [v for v in variants if v.kind == k]
        rng.shuffle(own)
        by_kind[k] = own + specific + generic if rng.random() < 0.75 else specific + own + generic

    def take(kind: str) -> Mutant | None:
        pool = by_kind.get(kind, [])
        while pool:
            item = pool.pop(0)
            if isinstance(item, Mutant):
                mutant = item
            else:
                try:
                    mutant = Mutant(kind, apply_site(reference, item), item.note)
                except (MutationError, SyntaxError, ValueError, RecursionError):
                    continue
            if mutant.code not in seen:  # both normalised by ast.unparse: equal text means equal AST
                seen.add(mutant.code)
                return mutant
        return None

    out: list[Mutant] = []
    for kind in forced:
        m = take(kind)
        if m is not None:
            out.append(m)
    weights = {k: KIND_WEIGHTS.get(k, 0.5) for k in kinds}
    used: set[str] = set()
    while len(out) < n:
        fresh = [k for k in weights if k not in used and by_kind.get(k)]
        pool = fresh or [k for k in weights if by_kind.get(k)]
        if not pool:
            break
        kind = rng.choices(pool, [weights[k] for k in pool])[0]
        used.add(kind)
        m = take(kind)
        if m is not None:
            out.append(m)
    return out
