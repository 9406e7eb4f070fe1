"""The routing benchmark chain: published full-information routing tables (RouterBench,
RouteLLM) imported as their authors ship them, prompt features, routers, the field's metrics
(AIQ, APGR, CPT) and OPE on bandit feedback simulated from the tables.

A chain above ``routing`` and ``rl``: it uses ``rl``'s BC, CQL, OPE and checkpoint code, and
nothing below imports it. Nothing here imports dagster.
"""
