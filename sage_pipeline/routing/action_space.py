"""The action space of a routing policy: which models each role may be routed to.

Roles come from the routing table (:attr:`RoutingTable.roles`), models from the table and
the logs; a model catalogue is never needed (it only adds prices, and capabilities for
the simulator). Two spaces share one ordered action tuple, so a policy of either space
is evaluated on the same logs with the same column order:

* ``multi_model``: per role, the table's primary and fallback plus every model the logs
  show for that role (what a router that may choose any model can do);
* ``sage_binary``: per role, only the table's primary and fallback, which is all SAGE's
  router can execute (its learned-policy hook chooses between the two).

The action order is the catalogue's for models it lists (so a simulator built on that
catalogue values policies column for column), then the table's models in order of
appearance, then logged models by name. ``routing_dataset`` writes the space it built as
``action_space.json`` beside the dataset, and every downstream asset reads that file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sage_pipeline import artifacts
from sage_pipeline.sage.table import RoutingTable

SPACES = ("multi_model", "sage_binary")
FILE_NAME = "action_space.json"


@dataclass(frozen=True, eq=False)
class ActionSpace:
    name: str  # one of SPACES
    roles: tuple[str, ...]
    actions: tuple[str, ...]
    mask: np.ndarray  # (n_roles, K) bool: model k may be chosen for role r
    primary: np.ndarray  # (n_roles,) int64 column of the role's primary
    fallback: np.ndarray  # (n_roles,) int64 column of the role's fallback
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if self.name not in SPACES:
            raise ValueError(f"action space {self.name!r}: use one of {', '.join(SPACES)}")
        if self.mask.shape != (len(self.roles), len(self.actions)):
            raise ValueError(f"mask shape {self.mask.shape} != ({len(self.roles)}, {len(self.actions)})")

    # the catalogue-like view every policy, learner and estimator reads
    @property
    def index(self) -> dict[str, int]:
        return {m: i for i, m in enumerate(self.actions)}

    @property
    def role_index(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.roles)}

    def role_mask(self) -> np.ndarray:
        return self.mask

    def candidates(self, role: str) -> tuple[str, ...]:
        row = self.mask[self.role_index[role]]
        return tuple(a for a, ok in zip(self.actions, row) if ok)

    def binary(self) -> "ActionSpace":
        """The same roles and action order, restricted to each role's primary and fallback."""
        m = np.zeros_like(self.mask)
        r = np.arange(len(self.roles))
        m[r, self.primary] = m[r, self.fallback] = True
        return ActionSpace("sage_binary", self.roles, self.actions, m, self.primary, self.fallback, self.source)

    def of(self, name: str) -> "ActionSpace":
        if name not in SPACES:
            raise ValueError(f"action space {name!r}: use one of {', '.join(SPACES)}")
        return self.binary() if name == "sage_binary" else self

    def in_space(self, role: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Per row: is the logged action allowed for the row's role in this space?"""
        return self.mask[np.asarray(role, dtype=np.int64), np.asarray(action, dtype=np.int64)]

    # ------------------------------------------------------------ build, save, load
    @classmethod
    def build(cls, table: RoutingTable, logged: list[tuple[str, str]] | None = None, catalogue=None,
              name: str = "multi_model") -> "ActionSpace":
        """From the table, the (role, model) pairs the logs show (roles the table does not
        route are ignored: their decisions are not routable by it) and, for the order only,
        a catalogue."""
        roles = table.roles
        r_idx = {r: i for i, r in enumerate(roles)}
        pairs = [(r, m) for r, m in (logged or []) if r in r_idx]
        seen = set(table.models) | {m for _, m in pairs}
        first = [m for m in (catalogue.actions if catalogue is not None else ()) if m in seen]
        rest = [m for m in table.models if m not in first]
        actions = tuple(first + rest + sorted(seen - set(first) - set(rest)))
        a_idx = {m: i for i, m in enumerate(actions)}
        mask = np.zeros((len(roles), len(actions)), dtype=bool)
        primary = table.primary_index(_Index(a_idx))
        fallback = table.fallback_index(_Index(a_idx))
        mask[np.arange(len(roles)), primary] = mask[np.arange(len(roles)), fallback] = True
        for r, m in pairs:
            mask[r_idx[r], a_idx[m]] = True
        space = cls("multi_model", roles, actions, mask, primary, fallback, table.source)
        return space.of(name)

    def to_dict(self) -> dict:
        return {"name": self.name, "roles": list(self.roles), "actions": list(self.actions),
                "mask": self.mask.astype(int).tolist(), "primary": self.primary.tolist(),
                "fallback": self.fallback.tolist(), "source": self.source}

    def save(self, path: str | Path) -> Path:
        return artifacts.write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: dict, source: str = "<memory>") -> "ActionSpace":
        try:
            return cls(d["name"], tuple(d["roles"]), tuple(d["actions"]), np.asarray(d["mask"], dtype=bool),
                       np.asarray(d["primary"], dtype=np.int64), np.asarray(d["fallback"], dtype=np.int64),
                       d.get("source", source))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: not an action space ({exc}); rematerialize routing_dataset") from exc

    @classmethod
    def load(cls, path: str | Path, name: str | None = None) -> "ActionSpace":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"action space {path} not found: materialize routing_dataset first")
        space = cls.from_dict(json.loads(path.read_text(encoding="utf-8")), str(path))
        return space.of(name) if name else space

    def describe(self) -> dict[str, list[str]]:
        """role -> its candidate models (for metadata)."""
        return {r: list(self.candidates(r)) for r in self.roles}


@dataclass(frozen=True)
class _Index:
    index: dict[str, int]
    source: str = "the action space"
