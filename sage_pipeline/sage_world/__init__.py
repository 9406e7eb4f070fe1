"""SAGE in the loop: a model world that stands in for every LLM SAGE calls (``world``, ``server``),
a harness that runs SAGE's own ``sage run`` against it (``harness``), and the days of the loop
(``loop``). Above ``rl``, ``routing`` and ``sim``; nothing here imports dagster."""
