"""The ledger as a person reads it: one row per candidate (state, running estimate and interval,
"evidence 3.1 of the 40 needed, about N more runs at the current effect", why), and a plot of each
candidate's running estimate and confidence sequence night by night."""

from __future__ import annotations

import math

import numpy as np

from sage_pipeline import artifacts, markdown
from sage_pipeline.decisions import evidence as ev
from sage_pipeline.decisions.ledger import Candidate, Ledger


def to_go(led: Ledger, c: Candidate) -> str:
    """The pending line: the evidence so far of the evidence needed, and about how many more
    observations at the current effect (per stream: runs, replayed tasks)."""
    st = led.standing(c.id)
    if c.state != "pending":
        if c.state == "accepted" and st.get("revert_evidence") is not None:
            return (f"on probation: evidence against a gain of {led.config.min_useful_gain} is "
                    f"{st['revert_evidence']:.1f} of the {st['revert_needed']:.0f} a revert needs "
                    f"({st.get('probation_n', 0)} observations since the accept)")
        return c.state
    parts = []
    for name in c.streams:
        s = led.stream(c, "streams", name)
        need = ev.observations_needed(np.array([math.log(max(st["evidence"], 1e-300))]), st["needed"],
                                      ev.growth_per_observation(s, 0.0))[0]
        more = f"about {int(need)} more" if np.isfinite(need) else "no end in sight at the current effect"
        parts.append(f"{name}: {more} ({int(s.n[0])} so far)")
    return (f"pending: evidence {st['evidence']:.1f} of the {st['needed']:.0f} needed"
            + ("; " + "; ".join(parts) if parts else "; no evidence yet"))


def rows(led: Ledger) -> list[dict]:
    out = []
    for c in led.data.candidates:
        st = led.standing(c.id)
        lo, hi = st["ci"]
        out.append({"candidate": c.id, "lever": c.lever, "change": (c.description or c.key)[:70], "state": c.state,
                    "estimate": st["estimate"], "interval": "—" if lo is None else f"[{lo:+.3f}, {hi:+.3f}]",
                    "evidence": st["evidence"], "needed": st["needed"], "standing": to_go(led, c),
                    "why": c.history[-1].reason if c.history else ""})
    return out


def markdown_table(led: Ledger) -> str:
    r = rows(led)
    if not r:
        return "_no candidate yet: nothing has been proposed on any lever_"
    return markdown.table(r, ["candidate", "lever", "change", "state", "estimate", "interval", "standing", "why"])


def plot(led: Ledger, max_candidates: int = 12) -> bytes | None:
    """Each candidate's running estimate and confidence sequence over its nights (PNG), the latest
    ``max_candidates``; None when no candidate has a night yet."""
    cands = [c for c in led.data.candidates if c.nights][-max_candidates:]
    if not cands:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for k, c in enumerate(cands):
        x = np.arange(1, len(c.nights) + 1) + 0.06 * k
        est = np.array([np.nan if r.estimate is None else r.estimate for r in c.nights])
        lo = np.array([np.nan if r.ci[0] is None else r.ci[0] for r in c.nights])
        hi = np.array([np.nan if r.ci[1] is None else r.ci[1] for r in c.nights])
        line, = ax.plot(x, est, marker="o", ms=3, lw=1, label=f"{c.id} ({c.state})")
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.12)
    ax.axhline(0.0, color="grey", lw=0.6, ls="--")
    ax.axhline(led.config.min_useful_gain, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("night of the candidate")
    ax.set_ylabel("gain (estimate, confidence sequence)")
    ax.set_title("Every decision's running estimate and interval (dotted: the minimum useful gain)", fontsize=9)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return artifacts.png_bytes(fig)
