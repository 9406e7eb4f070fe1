"""Small markdown helpers for asset metadata people read at a glance."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping, Sequence


def fmt(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def table(rows: Iterable[Mapping[str, object]], columns: Sequence[str] | None = None, digits: int = 3) -> str:
    rows = list(rows)
    if not rows:
        return "_(none)_"
    columns = list(columns or rows[0].keys())
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(r.get(c), digits) for c in columns) + " |" for r in rows]
    return "\n".join(out)


def image(png: bytes, alt: str) -> str:
    """A PNG embedded in markdown as a data URI (shows inline in the Dagster UI)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"
