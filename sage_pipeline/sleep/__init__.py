"""The nightly sleep cycle on SAGE's own skills: one store, one engine, one backend interface.

Pure (no dagster). The store is :class:`~sage_pipeline.sleep.sage_skills.SageSkillsRoot` (whole trees of SAGE's
nine ``SKILL.md``, one live, deployed through ``SAGE_SKILLS_ROOT``); the engine is
:func:`~sage_pipeline.sleep.sage_night.run_sage_night` (and :func:`~sage_pipeline.sleep.sage_night.run_sage_skills`,
the asset's work: harvest SAGE's runs, :mod:`.sage_harvest`; the online check, :mod:`.sage_online`; the night);
the backend interface is ``complete(messages, purpose, max_tokens)`` (:mod:`.backends`: Ollama's native
``/api/chat`` as SAGE calls it, or any OpenAI-compatible server). Shared parts: the learned block
(:mod:`.block`), the skill-text screen (:mod:`.skill_text`), the gate (:mod:`.gate`), the judge (:mod:`.judges`),
reflect's prompt (:mod:`.prompts`), the task records (:mod:`.records`). :mod:`.harness` is a test harness,
never imported by production code. ``python -m sage_pipeline.sleep`` acts on the root;
``sage_pipeline.defs.sleep_assets`` schedules the nights in Dagster.
"""
