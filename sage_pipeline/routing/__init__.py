"""Pure routing domain: log ingest, schema, rewards, static table, simulator, features.

Nothing here imports dagster.
"""
