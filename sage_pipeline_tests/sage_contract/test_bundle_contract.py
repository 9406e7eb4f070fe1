"""The deployment bundle against SAGE's own code (SAGE_PYTHON): SAGE's parser reads the models.yaml the
project writes and routes as the project says; SAGE's UCB bandit reads the bandit state and chooses as the
project says; SAGE's own loaders started during deploys always read one whole bundle; SAGE's shipped
table is the project's copy."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from shlex import quote as shlex_quote

import numpy as np

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bandit_state, bundle as bd, checkpoint as sr, explore as se
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import ALWAYS, NEVER, SAGE_TABLE, RoutingTable, Trigger

BIG = "qwen2.5-coder:14b-instruct-q4_K_M"


def _sage(sage_python: str, code: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")} | (env or {})
    out = subprocess.run([sage_python, "-c", textwrap.dedent(code)], cwd=cwd, env=full, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_shipped_models_yaml_is_sages_own(sage_python, tmp_path):
    got = _sage(sage_python, "from sage.config.paths import bundled_models_yaml as b\nprint(b())", tmp_path)
    assert Path(got.strip().splitlines()[-1]).read_bytes() == SAGE_TABLE.read_bytes()


def test_sages_parser_routes_every_written_table_as_the_project_does(sage_python, tmp_path):
    base = RoutingTable.load(SAGE_TABLE)
    rng = np.random.default_rng(3)
    tables = [base, base.with_route("coder", primary=BIG, fallback=BIG, triggers=NEVER),
              base.with_route("reviewer", triggers=ALWAYS), base.with_route("debugger", triggers=())]
    for _ in range(6):  # thresholds in SAGE's grammar, including awkward decimals
        t = base
        for role in ("coder", "reviewer", "debugger", "planner"):
            t = t.with_route(role, triggers=(
                Trigger("task_complexity_score", str(rng.choice([">", ">=", "<", "<="])),
                        float(rng.integers(0, 1000)) / 997),
                Trigger("primary_failure_count", str(rng.choice([">=", "==", ">"])), float(rng.integers(0, 6)))))
        tables.append(t)
    grid_c = sorted({0.0, 1.0, *np.round(rng.uniform(0, 1, 40), 6).tolist(),
                     *[float(str(tr).split()[-1]) for t in tables for r in t.routes.values() for tr in r.triggers
                       if tr.var == "task_complexity_score"]})
    paths = [t.write(tmp_path / f"t{i}.yaml") for i, t in enumerate(tables)]
    code = f"""
        import json
        from pathlib import Path
        from sage.orchestrator.model_router import ModelRouter
        out = []
        for p in {[str(p) for p in paths]!r}:
            r = ModelRouter(Path(p))
            out.append({{role: [[r.should_use_fallback(role, task_complexity_score=c, failure_count=k)
                                 for k in range(6)] for c in {grid_c!r}] for role in r.config["routing"]}})
        print(json.dumps(out))
    """
    sage = json.loads(_sage(sage_python, code, tmp_path).strip().splitlines()[-1])
    for t, got in zip(tables, sage, strict=True):
        roles = list(t.roles)
        for role, rows in got.items():
            i = roles.index(role)
            c = np.repeat(grid_c, 6)
            k = np.tile(np.arange(6), len(grid_c))
            ours = t.fallback_fires(np.full(len(c), i), c, k, k).reshape(len(grid_c), 6)
            assert ours.tolist() == rows, f"{t.source}: {role}"


def test_sages_bandit_reads_the_state_and_chooses_as_the_project_says(sage_python, tmp_path):
    for side in bandit_state.SIDES:
        ws = tmp_path / side
        bandit_state.write(ws.joinpath(*bandit_state.STATE_PATH), bandit_state.warm_start(side, count=50))
        code = f"""
            import json
            from sage.rl.ucb_bandit import get_global_bandit   # reads memory/rl/ucb_bandit.json of the cwd
            b = get_global_bandit()
            keys = {list(bandit_state.KEYS)!r}
            picks = []
            for i in range(40):
                k = b.select(strategy_keys=keys if i % 3 else keys[2:])
                picks.append(k)
                b.update(strategy_key=k, reward=0.3 if i % 2 else 0.9)
            print(json.dumps(picks))
        """
        picks = json.loads(_sage(sage_python, code, ws).strip().splitlines()[-1])
        ours, st = [], bandit_state.warm_start(side, count=50)
        for i in range(40):
            k = bandit_state.select(st, list(bandit_state.KEYS) if i % 3 else list(bandit_state.KEYS[2:]))
            ours.append(k)
            bandit_state.update(st, k, 0.3 if i % 2 else 0.9)
        assert picks == ours
        assert all(bandit_state.side_of(k) == side for i, k in enumerate(picks) if i % 3)
        assert bandit_state.read(ws.joinpath(*bandit_state.STATE_PATH)) == st  # SAGE's writes, read back


def test_target_table_is_read_by_sages_own_code_test_profile_included(sage_python, tmp_path):
    big = RoutingTable.load(SAGE_TABLE).with_route("coder", primary=BIG).write(tmp_path / "m.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    assert bd.target_table(sage_python, env | {"SAGE_MODELS_YAML": str(big)}).routes["coder"].primary == BIG
    shipped = bd.target_table(sage_python, env | {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "x")})
    assert sr.table_differences(RoutingTable.load(SAGE_TABLE), shipped) == []
    forced = bd.target_table(sage_python, env | {"SAGE_MODELS_YAML": str(big), "SAGE_FORCE_LOCAL_MODEL": "tiny:1b"})
    assert {r.primary for r in forced.routes.values()} == {"tiny:1b"}


def test_sages_loaders_started_during_deploys_read_one_whole_bundle(sage_python, tmp_path):
    sage_table = RoutingTable.load(SAGE_TABLE)
    bundles = {}
    for name, table, rate, floor in (("a", sage_table, 0.1, 0.1),
                                     ("b", sage_table.with_route("coder", primary=BIG), 0.3, 0.12)):
        ex = se.build_exploring(table, ActionSpace.build(table).binary(), se.ExploreConfig(rate=rate))
        sr.write_sage_checkpoint(tmp_path / f"ck-{name}", ex, {})
        bundles[name] = bd.build(tmp_path / f"bundle-{name}", table, sage_table, objective=TaskObjective(),
                                 checkpoint=tmp_path / f"ck-{name}", min_confidence=floor)
    root = tmp_path / "deploy"
    bd.deploy(bundles["a"], root, target=sage_table)
    code = f"""
        import json, os, time
        from pathlib import Path
        from sage.orchestrator.model_router import ModelRouter
        from sage.rl import policy
        env_file = Path({str(root / bd.ENV_FILE)!r})
        for n in range(150):
            for line in env_file.read_text().splitlines():   # what `. sage.env` does, once per SAGE start
                if line.startswith("export "):
                    k, _, v = line[7:].partition("=")
                    os.environ[k] = v
            router = ModelRouter()                           # SAGE_MODELS_YAML
            time.sleep(0.005)
            policy.clear_routing_policy_cache()
            pol = policy.get_routing_policy()                # SAGE_RL_CHECKPOINT, SAGE_RL_MIN_CONFIDENCE
            keep = pol._models["reviewer"].named_estimators_["keep"].estimator.class_prior_[1]  # the drawn rate
            print(json.dumps([router.config["routing"]["coder"]["primary"], pol.min_confidence, round(keep, 6)]),
                  flush=True)
    """
    proc = subprocess.Popen([sage_python, "-c", textwrap.dedent(code)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={k: v for k, v in os.environ.items() if not k.startswith("SAGE_")})
    deploys = 0

    def deployer():
        nonlocal deploys
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:  # until the loader has read 150 times
            bd.deploy(bundles["ab"[deploys % 2]], root, target=sage_table)
            deploys += 1

    t = threading.Thread(target=deployer)
    t.start()
    out, err = proc.communicate(timeout=240)
    t.join()
    assert proc.returncode == 0, err[-3000:]
    seen = [tuple(json.loads(x)) for x in out.splitlines() if x.startswith("[")]
    # what each bundle reads as, from SAGE's own loaders on one bundle alone
    whole = set()
    for name in "ab":
        env = bundles[name].env()
        whole.add(tuple(json.loads(_sage(sage_python, """
            from sage.orchestrator.model_router import ModelRouter
            from sage.rl import policy
            import json
            pol, router = policy.get_routing_policy(), ModelRouter()
            keep = pol._models["reviewer"].named_estimators_["keep"].estimator.class_prior_[1]
            print(json.dumps([router.config["routing"]["coder"]["primary"], pol.min_confidence, round(keep, 6)]))
        """, tmp_path, env).strip().splitlines()[-1])))
    assert len(whole) == 2, whole  # the two bundles are told apart by every part
    assert deploys >= 10 and len(seen) == 150
    assert set(seen) <= whole, f"mixed reads: {set(seen) - whole}"
    assert len(set(seen)) == 2  # both bundles were read while deploys ran


def test_sage_started_through_the_launcher_reads_its_drawn_arm(sage_python, tmp_path):
    """SAGE's own loaders, started by a deployed ``sage-run``: the coder SAGE's ModelRouter routes and the
    skills root its injector reads are the drawn arm's (inside the deployed version), and the run's
    trace id is the recorded draw."""
    from sage_pipeline.decisions import assign
    from sage_pipeline.sage.table import pin

    sage_table = RoutingTable.load(SAGE_TABLE)
    for name in ("live", "cand"):
        (tmp_path / name / "discipline" / "tdd").mkdir(parents=True)
        (tmp_path / name / "discipline" / "tdd" / "SKILL.md").write_text(f"# TDD\n{name}\n")
    pinned = pin(sage_table, "coder", BIG).write(tmp_path / "pin.yaml")
    b = bd.build(tmp_path / "bundle", sage_table, sage_table, objective=TaskObjective(), skills=tmp_path / "live",
                 arms={"coder": [("incumbent", None, 0.5, None), ("pin", "coder-0001", 0.5, pinned)],
                       "skills": [("live", None, 0.5, None), ("cand", "skills-0001", 0.5, tmp_path / "cand")]})
    code = ("import json, os\nfrom sage.orchestrator.model_router import ModelRouter\n"
            "from sage.prompt_engine.skill_injector import bundled_skills_root\n"
            "print(json.dumps([ModelRouter().config['routing']['coder']['primary'], str(bundled_skills_root()), "
            "os.environ['SAGE_TRACE_ID']]))\n")
    fake = tmp_path / "sage"
    fake.write_text(f"#!/bin/sh\nexec {sage_python} -c {shlex_quote(code)}\n")
    fake.chmod(0o755)
    root = tmp_path / "deploy 'x' $(y)"
    bd.deploy(b, root, target=sage_table, sage=str(fake))
    version = Path(os.path.abspath(root)) / "versions" / b.id
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    seen = []
    for _ in range(12):
        out = subprocess.run([str(root / bd.LAUNCHER), "task"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        seen.append(json.loads(out.stdout.strip().splitlines()[-1]))
    records, bad = assign.read_records(root / bd.ASSIGNMENTS, bd.deployed_plans(root)[0])
    assert bad == [] and len(records) == 12
    for coder, skills, trace in seen:
        arms = records[trace]["levers"]
        assert coder == (BIG if arms["coder"]["arm"] == "pin" else sage_table.routes["coder"].primary)
        assert skills == str(version / ("arms/skills/cand/skills" if arms["skills"]["arm"] == "cand" else "skills"))
