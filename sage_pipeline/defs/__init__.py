"""The Dagster layer: thin assets, checks, jobs and resources over the pure core."""
