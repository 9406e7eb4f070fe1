"""Resources: where artifacts live and which routing configuration the pipeline uses."""


import os
from functools import cached_property
from pathlib import Path

import dagster as dg

from sage_pipeline import artifacts
from sage_pipeline.routing.catalogue import DEFAULT_CATALOGUE, ModelCatalogue
from sage_pipeline.routing.table import DEFAULT_TABLE, RoutingTable


class SageResource(dg.ConfigurableResource):
    """The artifact root and the routing configuration (SAGE's models.yaml + the catalogue).

    Empty strings mean: ``$SAGE_DATA_DIR`` (else ``./datasets``), ``$SAGE_ROUTING_TABLE``
    and ``$SAGE_MODEL_CATALOGUE`` (else the packaged defaults).
    """

    data_dir: str = ""
    routing_table: str = ""
    model_catalogue: str = ""
    min_rows_per_role: int = 500

    def root(self) -> Path:
        return artifacts.data_dir(self.data_dir or None)

    def path(self, *parts: str) -> Path:
        return self.root().joinpath(*parts)

    def catalogue_path(self) -> Path:
        return Path(self.model_catalogue or os.environ.get("SAGE_MODEL_CATALOGUE") or DEFAULT_CATALOGUE)

    def table_path(self) -> Path:
        return Path(self.routing_table or os.environ.get("SAGE_ROUTING_TABLE") or DEFAULT_TABLE)

    @cached_property
    def catalogue(self) -> ModelCatalogue:
        return ModelCatalogue.load(self.catalogue_path())

    @cached_property
    def table(self) -> RoutingTable:
        return RoutingTable.load(self.table_path(), catalogue=self.catalogue)
