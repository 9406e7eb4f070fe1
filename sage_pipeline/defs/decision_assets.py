"""The decision ledger in the UI: ``decisions/decision_ledger`` shows every candidate change to what SAGE
runs (skill edits, the coder's model, the router checkpoint), each with its running estimate and
confidence sequence as a plot, where pending evidence stands ("evidence 3.1 of the 40 needed, about N
more runs at the current effect") and why each past decision was made.

Thin: the ledger is ``sage_pipeline.decisions.ledger`` (written by the levers' nights under
``<data>/decisions/ledger.json``); this asset reads it and reports it.
"""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import dagster as dg

from sage_pipeline import artifacts, markdown
from sage_pipeline.decisions import report
from sage_pipeline.decisions.ledger import LEDGER_NAME, LEVERS, Ledger, LedgerError
from sage_pipeline.defs.resources import SageResource

GROUP = "decisions"
LEDGER_DIR = "decisions"


@dg.asset(key=dg.AssetKey([GROUP, "decision_ledger"]), group_name=GROUP, kinds={"python"},
          description="Every candidate change to what SAGE runs, on every lever (skills, coder, router): pending, "
                      "accepted on probation, reverted or dropped, with its running estimate and confidence sequence "
                      "(valid however many nights it is looked at), the evidence it has of the evidence it needs, and "
                      "why each decision was made (datasets/decisions/ledger.json).")
def decision_ledger(context: dg.AssetExecutionContext, sage: SageResource) -> dg.MaterializeResult:
    path = sage.path(LEDGER_DIR, LEDGER_NAME)
    try:
        led = Ledger.load(path)
    except LedgerError as exc:
        raise dg.Failure(f"decision_ledger: {exc}") from exc
    counts = {lever: {s: len(led.of(lever, s)) for s in ("pending", "accepted", "reverted", "dropped")}
              for lever in LEVERS}
    png = report.plot(led)
    if png is not None:
        artifacts.write_bytes(sage.path("reports", "decision_ledger.png"), png)
    context.log.info(f"ledger {path}: {len(led.data.candidates)} candidates; "
                     + "; ".join(f"{k}: {v}" for k, v in counts.items()))
    cfg = led.config
    return dg.MaterializeResult(metadata={
        "ledger_path": dg.MetadataValue.path(str(path)),
        "exists": path.exists(),
        "candidates": len(led.data.candidates),
        "by_lever": dg.MetadataValue.json(counts),
        "guarantee": (f"per lever, the chance any candidate without a gain is ever accepted, over every night and "
                      f"every candidate, is at most {cfg.alpha} (each an e-process; candidate j at "
                      + "; ".join(f"{lv} alpha {s:g} ({1 - s:g})^(j-1)" for lv, s in sorted(cfg.first_share.items()))
                      + ("; " if cfg.first_share else "") + "the other levers at alpha/(j(j+1))); "
                      f"an accepted change is reverted when its gain is excluded above {cfg.min_useful_gain}"),
        "ledger": dg.MetadataValue.md(report.markdown_table(led)),
        "plot": dg.MetadataValue.md(markdown.image(png, "running estimates and intervals") if png
                                    else "_no candidate has a night yet_"),
    })


decision_defs = dg.Definitions(assets=[decision_ledger])
