"""The nightly sleep cycle: gated consolidation of an agent's skill documents and memory.

Pure (no dagster): records, harvest, replay, judges, reflect, edits on a protected
learned block, gate, content-hashed store, backends (simulated, OpenAI-compatible).
``python -m sage_pipeline.sleep`` lists versions, rolls a skill back and runs a night;
``sage_pipeline.defs.sleep_assets`` schedules it in Dagster.
"""
