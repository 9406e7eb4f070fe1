"""Errors a user can fix: each names the file, the field and what to do."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file (routing table, model catalogue, ...) is invalid."""

    def __init__(self, path: object, field: str, problem: str, fix: str = "") -> None:
        self.path, self.field, self.problem = str(path), field, problem
        msg = f"{path}: {field}: {problem}"
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)
