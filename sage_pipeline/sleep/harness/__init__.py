"""TEST HARNESS, never imported by production code (``sage_pipeline_tests/sleep/test_harness_boundary.py``
fails if a production module imports it).

What the sleep night's tests and benchmarks drive it with, none of it a claim about a real model:

- :mod:`.standin`: a whole-prompt stand-in model behind an OpenAI-compatible server on loopback (and in
  process), answering the night's SAGE-shaped coder calls and reflect with stated, seeded numbers;
- :mod:`.sim_world`: the simulated world's task pool (``data/sim_world.json``) and the packaged tasks
  (``data/tasks``) the stand-in knows the gold and naive answers of.
"""
