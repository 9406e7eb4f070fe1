"""UI hygiene of every Definitions object users see, written generally so it keeps holding
as chains add assets: every asset and check has a description, every asset sits in one of
the known groups, and lineage reads left to right: no asset depends on an asset of a
later chain (ARCHITECTURE.md's order)."""

from __future__ import annotations

import dagster as dg

from sage_pipeline.definitions import defs

# The asset groups, in lineage order (left to right in the UI): an asset may depend on its
# own group and on groups to its left, never on one to its right. routing_demo (the routing
# simulator's synthetic journals, not in make run) sits left of the chain that may read them.
GROUP_ORDER = ("routing_demo", "offline_routing", "routing_benchmark", "simulator", "sleep_cycle", "closed_loop",
               "sage_in_the_loop", "decisions")


def _undefined_stub(node) -> bool:
    """A key that only appears in another asset's deps: Dagster shows it as a bare external
    asset in group 'default', without a description."""
    return (node.is_external and not node.is_executable and not node.description
            and node.group_name == "default")


def ui_problems(definitions: dg.Definitions) -> list[str]:
    """Every way ``definitions`` breaks the UI rules, one readable line each."""
    graph = definitions.resolve_asset_graph()
    problems = []
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node, name = graph.get(key), key.to_user_string()
        if _undefined_stub(node):
            users = ", ".join(sorted(k.to_user_string() for k in node.child_keys))
            problems.append(f"asset {name} is a dependency of {users} but no fragment defines it: add its "
                            "chain's dg.Definitions to FRAGMENTS in sage_pipeline/definitions.py")
            continue
        if not (node.description or "").strip():
            problems.append(f"asset {name} (group {node.group_name}) has no description: pass "
                            "description=... to its @dg.asset")
        if node.group_name not in GROUP_ORDER:
            problems.append(f"asset {name} is in group {node.group_name!r}, not one of {GROUP_ORDER}: "
                            "set group_name=")
            continue
        rank = GROUP_ORDER.index(node.group_name)
        for parent in sorted(node.parent_keys, key=lambda k: k.to_user_string()):
            parent_group = graph.get(parent).group_name if graph.has(parent) else None
            if parent_group in GROUP_ORDER and GROUP_ORDER.index(parent_group) > rank:
                problems.append(f"asset {name} ({node.group_name}) depends on {parent.to_user_string()} "
                                f"({parent_group}), a later chain: lineage must read left to right "
                                f"in the order {' -> '.join(GROUP_ORDER)}")
    for check_key in sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        spec = graph.get_check_spec(check_key)
        if not (spec.description or "").strip():
            problems.append(f"check {check_key.name} on asset {check_key.asset_key.to_user_string()} has no "
                            "description: pass description=... to its check spec or @dg.asset_check")
    return problems


def test_every_asset_and_check_is_described_grouped_and_ordered():
    problems = ui_problems(defs)
    assert not problems, "UI rules broken:\n" + "\n".join(problems)


def test_rules_hold_on_a_real_graph_not_an_empty_one():
    graph = defs.resolve_asset_graph()
    groups = [graph.get(k).group_name for k in graph.get_all_asset_keys()]
    assert groups.count("offline_routing") >= 7
    assert len(graph.asset_check_keys) >= 3


def test_each_broken_rule_is_reported_by_name():
    @dg.asset(group_name="sleep_cycle", description="a night of the sleep cycle")
    def night() -> None: ...

    @dg.asset(group_name="offline_routing", deps=[night], description="reads a later chain")
    def backwards() -> None: ...

    @dg.asset(group_name="offline_routing")
    def undocumented() -> None: ...

    @dg.asset(group_name="misc", description="in no known group")
    def stray() -> None: ...

    @dg.asset(group_name="simulator", deps=["not_in_any_fragment"], description="reads an undefined asset")
    def orphan_user() -> None: ...

    @dg.asset_check(asset=night)
    def silent_check() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    @dg.asset_check(asset=night, description="has one")
    def described_check() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    problems = ui_problems(dg.Definitions(assets=[night, backwards, undocumented, stray, orphan_user],
                                          asset_checks=[silent_check, described_check]))
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "asset undocumented (group offline_routing) has no description" in text
    assert "asset stray is in group 'misc'" in text
    assert "asset backwards (offline_routing) depends on night (sleep_cycle), a later chain" in text
    assert "check silent_check on asset night has no description" in text
    assert "asset not_in_any_fragment is a dependency of orphan_user but no fragment defines it" in text
