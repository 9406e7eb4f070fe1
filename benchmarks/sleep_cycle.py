"""The nightly sleep cycle's goals, measured side by side over seeds of the simulated backend.

Part 1, learning. Per seed and skill, the simulated world generates a fresh task set
(ids, hence splits, differ per seed) and five nights run on it under three gates, from the
same start and with the same backend seed:

- ``gate``: the default (each edit gated on its own, mixed metric, ties reject, no
  per-task regression on val);
- ``gate_mean``: the same without the per-task no-regression rule (the mean only);
- ``no_gate``: every applicable edit accepted (SkillOpt's "gate off"), for contrast.

Reported per gate: the test-split score (the gate metric, and hard pass rate) before
night 1 and after night 5, how many seeds rise by >= 0.3, and how many harmful edits
(the world's ground truth: a rule that breaks other tasks) were accepted.

Part 2, failing backends. Nights whose backend fails: the simulated backend failing at a
random call (so in a random phase), and the OpenAI-compatible backend against a real
HTTP server on loopback that answers 500, 429, 401, 404, empty or non-JSON replies, or
too late. Every such night must end ``backend_error`` with the failure in its cause.

    .venv/bin/python benchmarks/sleep_cycle.py [--seeds 20] [--nights 5] [--skills coder reviewer]

Results: printed, and written to benchmarks/.scratch/sleep_cycle.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig
from sage_pipeline.sleep.cycle import CycleConfig
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.nightly import NightSettings, run_night
from sage_pipeline.sleep.records import write_task_file
from sage_pipeline.sleep.simulated_backend import FAILURES, SimulatedBackend, SimWorld

GATES = {
    "gate": GateConfig(),
    "gate_mean": GateConfig(no_regression=False),
    "no_gate": GateConfig(mode="off"),
}


def learning(seeds: int, n_nights: int, skills: list[str], scratch: Path) -> dict:
    out: dict = {}
    for skill in skills:
        world = SimWorld.load(skill)
        for name in GATES:
            out.setdefault(skill, {})[name] = {"seeds": []}
        for seed in range(seeds):
            tasks = world.generate_tasks(seed)
            cache: dict = {}  # sandbox verdicts by (code, tests): shared by the gates of one seed
            for name, gate in GATES.items():
                root = Path(tempfile.mkdtemp(prefix=f"{skill}-{name}-{seed}-", dir=scratch))
                write_task_file(root / "sleep" / skill / "tasks" / "sim.jsonl", tasks)
                st = NightSettings(sim_seed=seed, embedded_tasks=False, log_dirs=(), cycle=CycleConfig(gate=gate))
                curve, curve_hard, harmful, accepted, secs, calls, tokens = [], [], [], 0, 0.0, 0, 0
                for i in range(n_nights):
                    d = (date(2026, 11, 1) + timedelta(days=i)).isoformat()
                    t0 = time.perf_counter()
                    r, _ = run_night(root, skill, d, None, st, unit_cache=cache)
                    secs += time.perf_counter() - t0
                    assert r.status not in ("backend_error", "judge_error", "input_error"), (r.status, r.cause)
                    if i == 0:
                        curve.append(r.scores["test_before"]["score"])
                        curve_hard.append(r.scores["test_before"]["hard"])
                    curve.append(r.scores["test_after"]["score"])
                    curve_hard.append(r.scores["test_after"]["hard"])
                    acc = [e for e in r.edits if e["status"] == "accepted"]
                    accepted += len(acc)
                    harmful += [e["content"] for e in acc if world.classify(e["content"]) == "harmful"]
                    calls += r.calls["calls"]
                    tokens += r.calls["total_tokens"]
                out[skill][name]["seeds"].append({
                    "seed": seed, "test": curve, "test_hard": curve_hard, "rise": curve[-1] - curve[0],
                    "rise_hard": curve_hard[-1] - curve_hard[0], "accepted": accepted, "harmful_accepted": harmful,
                    "seconds_per_night": secs / n_nights, "calls_per_night": calls / n_nights,
                    "tokens_per_night": tokens / n_nights})
            print(f"  {skill} seed {seed}: " + ", ".join(
                f"{n} rise {out[skill][n]['seeds'][-1]['rise']:+.2f} "
                f"harm {len(out[skill][n]['seeds'][-1]['harmful_accepted'])}"
                for n in GATES), flush=True)
    for by in out.values():
        for d in by.values():
            s = d["seeds"]
            rise, rise_h = np.array([x["rise"] for x in s]), np.array([x["rise_hard"] for x in s])
            d["summary"] = {
                "test_before": float(np.mean([x["test"][0] for x in s])), "test_after": float(np.mean(
                    [x["test"][-1] for x in s])), "mean_rise": float(rise.mean()), "min_rise": float(rise.min()),
                "seeds_rise_ge_0.3": int((rise >= 0.3).sum()), "mean_rise_hard": float(rise_h.mean()),
                "min_rise_hard": float(rise_h.min()), "seeds_rise_hard_ge_0.3": int((rise_h >= 0.3).sum()),
                "harmful_accepted": int(sum(len(x["harmful_accepted"]) for x in s)),
                "seeds_with_harmful": int(sum(bool(x["harmful_accepted"]) for x in s)),
                "accepted_edits": int(sum(x["accepted"] for x in s)),
                "seconds_per_night": float(np.mean([x["seconds_per_night"] for x in s])),
                "calls_per_night": float(np.mean([x["calls_per_night"] for x in s])),
                "tokens_per_night": float(np.mean([x["tokens_per_night"] for x in s])), "seeds": len(s)}
    return out


class Failing:
    """An OpenAI-compatible server on loopback that fails in one way."""

    MODES: ClassVar[dict] = {
        "http_500": ((500, b'{"error": {"message": "internal server error"}}', {}), "HTTP 500"),
        "http_429": ((429, b'{"error": {"message": "rate limit"}}', {"Retry-After": "0"}), "HTTP 429"),
        "http_401": ((401, b'{"error": {"message": "invalid api key"}}', {}), "HTTP 401"),
        "http_404": ((404, b'{"error": {"message": "model not found"}}', {}), "HTTP 404"),
        "empty": ((200, json.dumps({"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]}).encode(),
                   {}), "empty reply"),
        "not_json": ((200, b"<html>gateway</html>", {}), "not JSON"),
        "timeout": (None, "timed out"),
    }

    def __init__(self) -> None:
        self.mode = "http_500"
        self.requests = 0
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                me.requests += 1
                spec = me.MODES[me.mode][0]
                if spec is None:
                    time.sleep(0.3)
                    spec = (200, b"{}", {})
                code, body, headers = spec
                try:
                    self.send_response(code)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def failing(seeds: int, scratch: Path) -> dict:
    rng = np.random.default_rng(2026)
    server = Failing()
    rows = []
    sim_kinds = list(FAILURES)
    http_kinds = list(Failing.MODES)
    for seed in range(seeds):
        # the simulated backend failing at a random call of the night
        skill = ("coder", "reviewer")[seed % 2]
        kind = sim_kinds[seed % len(sim_kinds)]
        at = int(rng.integers(1, 160))
        root = Path(tempfile.mkdtemp(prefix=f"fail-sim-{seed}-", dir=scratch))
        b = SimulatedBackend(SimWorld.load(skill), seed=seed, night="2026-11-03", fail_at_call=at, failure=kind)
        r, _ = run_night(root, skill, "2026-11-03", None, NightSettings(sim_seed=seed, log_dirs=()), backend=b)
        rows.append({"backend": "simulated", "mode": kind, "seed": seed, "fail_at_call": at, "status": r.status,
                     "phase": r.phase, "cause": r.cause, "cause_ok": r.cause == FAILURES[kind][1]})
        # the HTTP backend against a failing server
        server.mode = http_kinds[seed % len(http_kinds)]
        root = Path(tempfile.mkdtemp(prefix=f"fail-http-{seed}-", dir=scratch))
        hb = OpenAIBackend(OpenAIConfig(base_url=server.url, model="bench", max_retries=2, backoff_s=0.01,
                                        timeout_s=0.1))
        t0 = time.perf_counter()
        r, _ = run_night(root, "reviewer", "2026-11-03", None, NightSettings(log_dirs=()), backend=hb)
        rows.append({"backend": "openai", "mode": server.mode, "seed": seed, "status": r.status, "phase": r.phase,
                     "cause": r.cause, "cause_ok": Failing.MODES[server.mode][1] in r.cause,
                     "attempts": len(r.call_errors), "seconds": time.perf_counter() - t0})
    server.httpd.shutdown()
    return {"rows": rows, "nights": len(rows), "backend_error": sum(x["status"] == "backend_error" for x in rows),
            "cause_named": sum(x["cause_ok"] for x in rows),
            "scored_as_wrong_answer": sum(x["status"] != "backend_error" for x in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=count, default=20)
    p.add_argument("--nights", type=int, default=5)
    p.add_argument("--skills", nargs="+", default=["coder", "reviewer"])
    args = p.parse_args()
    scratch_root = ROOT / "benchmarks" / ".scratch"
    scratch_root.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix="sleep-") as tmp:
        print(f"part 1: {args.seeds} seeds x {len(args.skills)} skills x {len(GATES)} gates x {args.nights} nights")
        learn = learning(args.seeds, args.nights, args.skills, Path(tmp))
        print(f"part 2: {2 * args.seeds} nights with a failing backend")
        fail = failing(args.seeds, Path(tmp))
    total = time.perf_counter() - t0

    print(f"\nTest-split score (gate metric: mixed 0.5 hard + 0.5 soft; hard = pass rate), {args.seeds} seeds, "
          f"before night 1 -> after night {args.nights}:\n")
    head = ("| skill | gate | test before | test after | mean rise | min rise | seeds rise >= 0.3 | mean rise (hard) | "
            "seeds rise (hard) >= 0.3 | harmful accepted (seeds) | accepted edits | s/night | calls/night |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for skill, by in learn.items():
        for name, d in by.items():
            s = d["summary"]
            print(f"| {skill} | {name} | {s['test_before']:.3f} | {s['test_after']:.3f} | {s['mean_rise']:+.3f} | "
                  f"{s['min_rise']:+.3f} | {s['seeds_rise_ge_0.3']}/{s['seeds']} | {s['mean_rise_hard']:+.3f} | "
                  f"{s['seeds_rise_hard_ge_0.3']}/{s['seeds']} | {s['harmful_accepted']} ({s['seeds_with_harmful']}) | "
                  f"{s['accepted_edits']} | {s['seconds_per_night']:.2f} | {s['calls_per_night']:.0f} |")
    print("\nRatios (same seeds, same run):")
    for skill, by in learn.items():
        g, ng, gm = by["gate"]["summary"], by["no_gate"]["summary"], by["gate_mean"]["summary"]
        print(f"  {skill}: harmful accepted gate/no_gate = {g['harmful_accepted']}/{ng['harmful_accepted']}, "
              f"gate/gate_mean = {g['harmful_accepted']}/{gm['harmful_accepted']}; "
              f"mean rise gate/no_gate = {g['mean_rise'] / ng['mean_rise'] if ng['mean_rise'] else float('nan'):.2f}; "
              f"calls per night gate/no_gate = {g['calls_per_night'] / max(ng['calls_per_night'], 1):.2f}")
    print(f"\nFailing backends: {fail['backend_error']}/{fail['nights']} nights ended backend_error, "
          f"{fail['cause_named']}/{fail['nights']} with the failure named in the cause, "
          f"{fail['scored_as_wrong_answer']} scored instead.\n")
    print("| backend | mode | nights | backend_error | cause named | phases | example cause |")
    print("|---|---|---|---|---|---|---|")
    groups: dict = {}
    for x in fail["rows"]:
        groups.setdefault((x["backend"], x["mode"]), []).append(x)
    for (b, m), xs in groups.items():
        print(f"| {b} | {m} | {len(xs)} | {sum(x['status'] == 'backend_error' for x in xs)} | "
              f"{sum(x['cause_ok'] for x in xs)} | {', '.join(sorted({x['phase'] for x in xs}))} | "
              f"{xs[0]['cause'][:90]} |")
    goals = {skill: {"mean_rise_ge_0.3": by["gate"]["summary"]["mean_rise"] >= 0.3,
                     "seeds_rise_ge_0.3": by["gate"]["summary"]["seeds_rise_ge_0.3"],
                     "no_harmful_accepted": by["gate"]["summary"]["harmful_accepted"] == 0}
             for skill, by in learn.items()}
    goals["failing_backend_always_backend_error_with_cause"] = fail["cause_named"] == fail["nights"] == fail[
        "backend_error"]
    print(f"\nGoals (default gate): {json.dumps(goals)}")
    print(f"total {total:.0f} s; load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    out = scratch_root / "sleep_cycle.json"
    out.write_text(json.dumps({"args": vars(args), "learning": learn, "failing": fail, "goals": goals,
                               "seconds": total, "load_before": load, "load_after": os.getloadavg(),
                               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                           "platform": platform.platform()}}, indent=1, default=str))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
