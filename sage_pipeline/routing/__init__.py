"""Pure routing domain: log ingest, schema, rewards, static table, the policy contract, the routing simulator, features.

Nothing here imports dagster.
"""
