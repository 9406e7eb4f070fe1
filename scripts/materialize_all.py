"""make run: every asset on embedded defaults, in lineage order, as `dagster asset materialize` runs them.

`dagster asset materialize --select '*'` cannot mix partitioned and unpartitioned assets in one run,
so the graph is materialized in five steps (:func:`steps`):

  1. every unpartitioned asset upstream of the partitioned ones (the offline routing chain on SAGE's
     own journals: sage_week, the shipped SAGE week and, with SAGE_PYTHON, a live SAGE day first; the
     routing-benchmark import; sim_tasks), with their checks;
  2. sandbox_rollouts, all shards in one run (single-run backfill policy);
  3. what depends on the rollouts (ppo_policy);
  4. the sleep cycle on SAGE's skills root, one night per day of the embedded SAGE week (oldest first,
     SLEEP_NIGHTS of them, default 3; the first partitions when the week is not there);
  5. the decision ledger every lever's nights wrote (group decisions).

The simulated month (group closed_loop, job simulated_month), SAGE in the loop (group sage_in_the_loop:
needs SAGE_PYTHON) and the routing simulator's demo journals (group routing_demo) are not part of it: run
on demand (README). Then the summary read back from the instance (scripts/run_summary.py).

Two ways to run the same steps, with the same runs in the instance:

- by default, in this process: each step is Dagster's own ``execute_materialize_command``, the function
  behind `dagster asset materialize`, called with the same selection and partitions, so the code location
  is loaded once and every run's steps fork from one forkserver that preloaded it (the project's
  executor). A `dagster` command per step loads the code location twice (the CLI, then its forkserver):
  about 17 s a step on this project's 2-core machine (docs/benchmarks.md, "make run's materialization");
- ``--cli``: one `dagster asset materialize` command per step (what CI runs, so the command itself is
  tested every time).

Uses DAGSTER_HOME and SAGE_DATA_DIR from the environment (the Makefile sets them). Exits 1 naming the step
that failed; the steps before it keep what they materialized.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MODULE = "sage_pipeline.definitions"


@dataclass(frozen=True)
class Step:
    title: str
    select: str
    partition: str | None = None
    partition_range: str | None = None

    def cli_args(self) -> list[str]:
        args = ["--select", self.select]
        if self.partition is not None:
            args += ["--partition", self.partition]
        if self.partition_range is not None:
            args += ["--partition-range", self.partition_range]
        return args


def steps(nights: int) -> list[Step]:
    """The five steps, in lineage order; ``nights`` sleep-cycle nights (partition keys from the shipped week)."""
    from run_summary import ON_DEMAND  # scripts/run_summary.py: the groups make run leaves out

    from sage_pipeline.defs.sim_assets import SHARDS
    from sage_pipeline.defs.sleep_assets import default_nights

    # step 1: neither the later steps' assets nor the groups run on demand
    first = " and ".join(["not key:sandbox_rollouts", "not key:ppo_policy", "not group:sleep_cycle",
                          "not group:decisions", *(f"not group:{g}" for g in ON_DEMAND)])
    keys = SHARDS.get_partition_keys()
    shards = f"{keys[0]}...{keys[-1]}"
    out = [Step("1/5 unpartitioned assets", first),
           Step(f"2/5 sandbox_rollouts, shards {shards}", "sandbox_rollouts", partition_range=shards),
           Step("3/5 ppo_policy", "ppo_policy")]
    out += [Step(f"4/5 sleep cycle, night {night}", "group:sleep_cycle", partition=night)
            for night in default_nights(nights)]
    return out + [Step("5/5 the decision ledger", "group:decisions")]


def _nights_from_env() -> int:
    raw = os.environ.get("SLEEP_NIGHTS", "3")
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise SystemExit(f"SLEEP_NIGHTS must be a whole number >= 0, got {raw!r}")
    return n


def run_in_process(step: Step) -> None:
    """``step`` as `dagster asset materialize` runs it, in this process (raises when the run fails)."""
    import dagster as dg
    from dagster._cli.asset import execute_materialize_command
    from dagster._cli.workspace.cli_target import PythonPointerOpts

    with dg.DagsterInstance.get() as instance:
        execute_materialize_command(instance=instance, select=step.select, partition=step.partition,
                                    partition_range=step.partition_range, config=(), config_json=None,
                                    python_pointer_opts=PythonPointerOpts(module_name=MODULE))


def run_cli(step: Step) -> None:
    """``step`` as one `dagster asset materialize` command (raises when it exits non-zero)."""
    dagster = os.environ.get("DAGSTER_BIN") or str(Path(sys.executable).parent / "dagster")
    subprocess.run([dagster, "asset", "materialize", "-m", MODULE, *step.cli_args()], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", action="store_true",
                        help="one `dagster asset materialize` command per step (CI), not one process")
    args = parser.parse_args(argv)
    home = os.environ.get("DAGSTER_HOME", "")
    if not home or not os.path.isdir(home):
        print(f"make run: DAGSTER_HOME={home!r} is not a folder: set it to the Dagster instance's folder (make run "
              "sets it to .dagster_home and creates it)", file=sys.stderr)
        return 2
    from sage_pipeline.defs import run_reaper

    # a run of this instance killed earlier (kill -9, a closed laptop) would hold its pool slot and leave the
    # pooled steps below waiting forever: mark it failed and free its slots (every run does it again too)
    run_reaper.main()
    run = run_cli if args.cli else run_in_process
    plan = steps(_nights_from_env())
    t_all = time.perf_counter()
    for step in plan:
        print(f"\n== {step.title}", flush=True)
        t0 = time.perf_counter()
        try:
            run(step)
        except Exception as exc:  # a failed run (ClickException, CalledProcessError): name the step, keep the rest
            print(f"make run: step '{step.title}' failed ({type(exc).__name__}: {exc}); what the steps before "
                  "it materialized is kept. Its run's log is in the Dagster UI (make dev) and above.",
                  file=sys.stderr)
            return 1
        print(f"== {step.title}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\n== {len(plan)} steps in {time.perf_counter() - t_all:.1f} s "
          f"({'a dagster command each' if args.cli else 'one process'})", flush=True)
    import run_summary  # scripts/run_summary.py, beside this file

    return run_summary.main()


if __name__ == "__main__":
    sys.exit(main())
