"""The reward report: what the logged routing decisions earned, before anything learns from them.

Read from the routing dataset (one row per decision), it answers the questions an engineer
asks before trusting a learned router:

* How good is the logged behaviour overall (reward distribution, verification success,
  timeouts, cost) and how much of it is fallback or exploration?
* Which roles and which models (and which model in which role) earn the most, and how
  spread out is their reward?
* Where does a model stop paying off as tasks get harder (mean reward per complexity bin)?
* Can off-policy evaluation use logged propensities, or must they be estimated?

``compute_reward_report`` returns plain JSON (no NaN: missing figures are ``None``);
``report_markdown`` and the ``plot_*`` functions render it for the Dagster UI, and
``write_reward_report`` writes ``reward_report.json`` and the plots atomically.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sage_pipeline import artifacts, markdown

REPORT_NAME = "reward_report.json"
REQUIRED_COLUMNS: tuple[str, ...] = (
    "episode_id", "session_id", "role", "model", "action_kind", "fallback_triggered", "reward", "reward_version",
    "verification_passed", "timed_out", "task_complexity_score", "cost_usd", "propensity_source",
    "split", "data_source",
)
QUANTILES: dict[str, float] = {"p5": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95}
COMPLEXITY_BINS = 5  # equal-width bins over [0, 1]; the last one is closed: [0.8, 1.0]


def check_columns(df: pd.DataFrame, required: tuple[str, ...] = REQUIRED_COLUMNS) -> None:
    """Raise a ValueError that names what is missing, and what to do about it."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"routing dataset lacks columns {missing} needed by the reward report: "
                         "materialize routing_dataset first (or rebuild it with the current schema)")
    if df.empty:
        raise ValueError("routing dataset has no rows, so there is nothing to report: "
                         "materialize routing_dataset first (and check the trajectories asset's quarantine)")


def _clean(x: Any) -> Any:
    """Numpy scalars to Python, NaN/NA to None (JSON has no NaN)."""
    if x is None or x is pd.NA or (isinstance(x, float | np.floating) and not math.isfinite(x)):
        return None
    return x.item() if isinstance(x, np.generic) else x


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The columns the report reads: categorical keys, float indicators (NaN where unknown), bins."""
    passed = df["verification_passed"].astype("boolean").to_numpy(dtype="float64", na_value=np.nan)
    score = df["task_complexity_score"].to_numpy(dtype="float64")
    keys = {k: df[k].astype("category") for k in ("role", "model", "action_kind")}
    return pd.DataFrame({
        **keys,
        "reward": df["reward"].to_numpy(dtype="float64"),
        "passed": passed,
        "timed_out": df["timed_out"].to_numpy(dtype="float64"),
        # how often the table's fallback triggers fired (whether or not exploration followed it)
        "fallback": df["fallback_triggered"].to_numpy(dtype="float64"),
        "cost_usd": df["cost_usd"].to_numpy(dtype="float64"),
        # scores are validated into [0, 1]; 1.0 falls in the last (closed) bin
        "complexity_bin": np.clip(np.floor(score * COMPLEXITY_BINS), 0, COMPLEXITY_BINS - 1).astype("int64"),
    })


def _group_stats(p: pd.DataFrame, keys: list[str], fallback: bool = False) -> pd.DataFrame:
    """Per group of ``keys``: reward count, mean, std, quantiles; success, timeout, cost."""
    g = p.groupby(keys, sort=True, observed=True)
    q = g["reward"].quantile(list(QUANTILES.values())).unstack()
    q.columns = list(QUANTILES)
    out = pd.DataFrame({"count": g.size(), "mean": g["reward"].mean(), "std": g["reward"].std()}).join(q)
    out["success_rate"] = g["passed"].mean()  # NaN (unknown verification) is skipped
    out["verification_known"] = g["passed"].count()
    out["timeout_rate"] = g["timed_out"].mean()
    out["mean_cost_usd"] = g["cost_usd"].mean()
    if fallback:
        out["fallback_rate"] = g["fallback"].mean()
    return out


def _records(stats: pd.DataFrame) -> dict[str, Any]:
    """{group: {stat: value}}, nested one level per key for multi-key groups."""
    out: dict[str, Any] = {}
    for key, row in stats.to_dict("index").items():
        *outer, last = key if isinstance(key, tuple) else (key,)
        node = out
        for k in outer:
            node = node.setdefault(str(k), {})
        rec = {k: _clean(v) for k, v in row.items()}
        rec["count"], rec["verification_known"] = int(row["count"]), int(row["verification_known"])
        node[str(last)] = rec
    return out


def _value_counts(s: pd.Series) -> dict[str, int]:
    return {str(k): int(v) for k, v in s.value_counts().sort_index().items()}


def _by_complexity(p: pd.DataFrame, key: str) -> dict[str, dict[str, list]]:
    """Per group: reward count and mean in each complexity bin (empty bin: 0 and None)."""
    agg = p.groupby([key, "complexity_bin"], sort=True, observed=True)["reward"].agg(["count", "mean"])
    cols = range(COMPLEXITY_BINS)
    count = agg["count"].unstack().reindex(columns=cols).fillna(0).astype("int64")
    mean = agg["mean"].unstack().reindex(columns=cols)
    return {str(k): {"count": [int(c) for c in count.loc[k]], "mean": [_clean(m) for m in mean.loc[k]]}
            for k in count.index}


def compute_reward_report(df: pd.DataFrame) -> dict[str, Any]:
    """The reward report of a routing dataset, as JSON-serialisable dicts (see module doc)."""
    check_columns(df)
    p = _prepare(df)
    overall = _records(_group_stats(p.assign(all="all"), ["all"]))["all"]
    n = len(df)
    edges = np.linspace(0.0, 1.0, COMPLEXITY_BINS + 1).round(6).tolist()
    return {
        "overall": {
            "rows": n,
            "episodes": int(df["episode_id"].nunique()),
            "sessions": int(df["session_id"].nunique()),
            "reward_versions": sorted(map(str, df["reward_version"].unique())),
            **{k: v for k, v in overall.items() if k != "count"},
            "fallback_rate": _clean(p["fallback"].mean()),
            "explore_share": _clean((p["action_kind"] == "explore").mean()),
            "logged_propensity_share": _clean((df["propensity_source"] == "logged").mean()),
            "rows_by_split": _value_counts(df["split"]),
            "rows_by_data_source": _value_counts(df["data_source"]),
        },
        "by_role": _records(_group_stats(p, ["role"], fallback=True)),
        "by_model": _records(_group_stats(p, ["model"])),
        "by_role_model": _records(_group_stats(p, ["role", "model"])),
        "by_action_kind": _records(_group_stats(p, ["action_kind"])),
        "reward_vs_complexity": {
            "edges": edges,
            "bins": [f"[{lo:.1f}, {hi:.1f}{']' if i == COMPLEXITY_BINS - 1 else ')'}"
                     for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))],
            "by_role": _by_complexity(p, "role"),
            "by_model": _by_complexity(p, "model"),
        },
    }


# ---------------------------------------------------------------- rendering
def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _usd(x: float | None) -> str:
    return "–" if x is None else f"${x:#.3g}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items())


def _group_rows(label: str, groups: dict[str, dict[str, Any]],
                fallback: bool = False) -> list[dict[str, str]]:
    return [{label: f"`{name}`", "n": f"{s['count']:,}", "mean": _num(s["mean"]), "std": _num(s["std"]),
             "p5": _num(s["p5"]), "p50": _num(s["p50"]), "p95": _num(s["p95"]),
             "success": _pct(s["success_rate"]), "timeout": _pct(s["timeout_rate"]),
             **({"fallback": _pct(s["fallback_rate"])} if fallback else {}), "cost": _usd(s["mean_cost_usd"])}
            for name, s in groups.items()]


def report_markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables: key figures, then per role and per model."""
    o = report["overall"]
    figures = {
        "decisions / episodes / sessions": f"{o['rows']:,} / {o['episodes']:,} / {o['sessions']:,}",
        "reward version": ", ".join(o["reward_versions"]),
        "mean reward (std)": f"{_num(o['mean'])} ({_num(o['std'])})",
        "p5 / p25 / p50 / p75 / p95": " / ".join(_num(o[k]) for k in QUANTILES),
        "verification success": f"{_pct(o['success_rate'])} of {o['verification_known']:,} decisions "
                                "with a known outcome",
        "timeout rate": _pct(o["timeout_rate"]),
        "fallback rate / explore share": f"{_pct(o['fallback_rate'])} / {_pct(o['explore_share'])}",
        "mean cost per decision": _usd(o["mean_cost_usd"]),
        "logged propensities": _pct(o["logged_propensity_share"]),
        "rows by split": _counts(o["rows_by_split"]),
        "rows by data source": _counts(o["rows_by_data_source"]),
    }
    parts = ["### Overall", markdown.table({"figure": k, "value": v} for k, v in figures.items())]
    if len(o["reward_versions"]) > 1:
        parts.append("**Warning:** the dataset mixes reward versions; their rewards are not comparable.")
    if (o["logged_propensity_share"] or 0.0) < 1.0:
        parts.append("Some decisions lack logged propensities: off-policy evaluation estimates them (BC).")
    parts += ["### By role", markdown.table(_group_rows("role", report["by_role"], fallback=True)),
              "### By model", markdown.table(_group_rows("model", report["by_model"]))]
    return "\n\n".join(parts) + "\n"


def plot_reward_by_role(df: pd.DataFrame) -> bytes:
    """Box plot of the reward per role (PNG bytes)."""
    check_columns(df, ("role", "reward"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = {str(role): r.dropna().to_numpy() for role, r in df.groupby("role", sort=True)["reward"]}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot(list(rewards.values()), showmeans=True, flierprops={"markersize": 2})
    ax.set_xticks(range(1, len(rewards) + 1), [f"{role} ({len(r)})" for role, r in rewards.items()],
                  rotation=30, ha="right", fontsize=7)
    ax.axhline(0.0, color="grey", lw=0.6, ls="--")
    ax.set_ylabel("reward")
    ax.set_title("Reward per role (decisions in brackets; triangle: mean)", fontsize=9)
    return artifacts.png_bytes(fig)


def plot_reward_vs_complexity(report: dict[str, Any]) -> bytes:
    """Mean reward per complexity bin, one line per model (PNG bytes); gaps are empty bins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rvc = report["reward_vs_complexity"]
    edges = np.asarray(rvc["edges"])
    centers = (edges[:-1] + edges[1:]) / 2
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model, s in rvc["by_model"].items():
        ax.plot(centers, [np.nan if m is None else m for m in s["mean"]], marker="o", ms=3, label=model)
    ax.set_xticks(edges)
    ax.set_xlim(0.0, 1.0)
    ax.axhline(0.0, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("task complexity score")
    ax.set_ylabel("mean reward")
    ax.set_title("Mean reward vs task complexity, per model", fontsize=9)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return artifacts.png_bytes(fig)


def write_reward_report(report: dict[str, Any], pngs: dict[str, bytes],
                        out_dir: str | Path) -> dict[str, Path]:
    """Write ``reward_report.json`` and ``<name>.png`` per plot into ``out_dir``, each atomically.

    Returns the paths by name: ``"reward_report"`` and each key of ``pngs``.
    """
    out_dir = Path(out_dir)
    bad = [name for name in pngs if not name or Path(name).name != name or name == "reward_report"]
    if bad:
        raise ValueError(f"plot names {bad} must be plain file names other than 'reward_report' "
                         "(e.g. 'reward_by_role')")
    paths = {"reward_report": artifacts.write_json(out_dir / REPORT_NAME, report)}
    for name, png in pngs.items():
        paths[name] = artifacts.write_bytes(out_dir / f"{Path(name).stem}.png", png)
    return paths
