"""Resources: where artifacts live and which routing configuration the pipeline uses."""


import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from sage_pipeline import artifacts
from sage_pipeline.routing.catalogue import SAGE_CATALOGUE, ModelCatalogue
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable
from sage_pipeline.sim.sandbox import SandboxConfig, SandboxError, check_docker, open_sandbox


class SageResource(dg.ConfigurableResource):
    """The artifact root and the routing configuration (SAGE's models.yaml + the catalogue).

    A path left unset (null, the default) is read from the environment when a run uses it,
    never when the code is loaded: ``$SAGE_DATA_DIR`` (else ``./datasets``), ``$SAGE_ROUTING_TABLE``
    and ``$SAGE_MODEL_CATALOGUE``, else SAGE's own table (``sage.table.SAGE_TABLE``, SAGE's shipped
    ``models.yaml``) and its catalogue (``routing.catalogue.SAGE_CATALOGUE``). The project's example
    multi-model pair (``sage.table.DEFAULT_TABLE``, ``routing.catalogue.DEFAULT_CATALOGUE``) is for
    the demos that need many models: name both to use it.
    """

    data_dir: str | None = Field(None, min_length=1, description="the artifact root; unset: $SAGE_DATA_DIR as the "
                                 "run sees it, else ./datasets")
    routing_table: str | None = Field(None, min_length=1, description="SAGE's models.yaml (roles, primary, fallback, "
                                      "triggers); unset: $SAGE_ROUTING_TABLE as the run sees it, else SAGE's own "
                                      "(its shipped models.yaml)")
    model_catalogue: str | None = Field(None, min_length=1, description="the model catalogue (prices, the "
                                        "simulator's capabilities); unset: $SAGE_MODEL_CATALOGUE as the run sees it, "
                                        "else the catalogue of SAGE's own table")
    min_rows_per_role: int = Field(500, ge=1, description="the routing dataset's volume check: rows every role "
                                   "needs")

    def root(self) -> Path:
        return artifacts.data_dir(self.data_dir)

    def path(self, *parts: str) -> Path:
        return self.root().joinpath(*parts)

    @contextlib.contextmanager
    def writing(self, name: str, members: Sequence[str], log: Callable[[str], None]) -> Iterator[artifacts.SetStage]:
        """Write the asset ``name``'s files (``members``, relative to the root) as one set:
        one run at a time (artifacts.exclusive), switched together (artifacts.atomic_set), so
        a kill at any moment leaves one run's set whole (``artifacts.exclusive_set``, which the
        core calls itself where it writes an asset's set)."""
        with artifacts.exclusive_set(self.root(), name, members, log) as stage:
            yield stage

    def catalogue_path(self) -> Path:
        return Path(self.model_catalogue or os.environ.get("SAGE_MODEL_CATALOGUE") or SAGE_CATALOGUE)

    def table_path(self) -> Path:
        return Path(self.routing_table or os.environ.get("SAGE_ROUTING_TABLE") or SAGE_TABLE)

    @cached_property
    def catalogue(self) -> ModelCatalogue:
        return ModelCatalogue.load(self.catalogue_path())

    @cached_property
    def table(self) -> RoutingTable:
        return RoutingTable.load(self.table_path())


class SandboxResource(dg.ConfigurableResource, SandboxConfig):
    """Where candidate code runs: ``sage_pipeline.sim.sandbox.SandboxConfig`` (workers, image,
    limits), with one more backend. ``backend``: 'docker' (hardened containers; an error that says
    how to start the daemon when it does not answer), 'local' (unisolated processes, for the
    project's own generated tasks only) or 'auto' (Docker when its daemon answers and the image
    is there, else local — logged as a warning and marked unisolated in metadata). Code the
    project did not write (an external suite's candidates: ``untrusted=True``) runs in Docker
    only: 'auto' then never falls back, and 'local' is refused."""

    backend: Literal["auto", "docker", "local"] = Field(
        "auto", description="'auto' (Docker when its daemon answers and the image is there, else local, with a "
                            "warning), 'docker' or 'local' (unisolated: the project's own generated tasks only)")

    def resolve_backend(self, log=None, untrusted: bool = False) -> str:
        if self.backend != "auto":
            return self.backend
        try:
            check_docker(SandboxConfig(image=self.image))
            return "docker"
        except SandboxError as e:
            if untrusted:
                raise SandboxError(f"sandbox backend 'auto': Docker is not usable ({e}), and this code was not "
                                   "written by the project: it never runs in the unisolated local backend") from e
            if log is not None:
                log.warning(f"sandbox backend 'auto': Docker is not usable ({e}); running the project's own "
                            "generated tasks in UNISOLATED local processes. Set backend='docker' to require it.")
            return "local"

    def open(self, log=None, untrusted: bool = False):
        untrusted = untrusted or self.untrusted
        options = self.model_dump(include=set(SandboxConfig.model_fields) - {"backend", "untrusted"})
        return open_sandbox(self.resolve_backend(log, untrusted), untrusted=untrusted, **options)
