"""Decisions that hold for a month: the ledger of every candidate change to what SAGE runs (a skill
edit, the coder's model, the router checkpoint), its anytime-valid evidence, and the recorded random
assignment of ``sage run``s that feeds it. Pure: no dagster."""
