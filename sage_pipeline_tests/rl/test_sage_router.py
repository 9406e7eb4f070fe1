"""What SAGE's router runs: distilled per-role classifiers behind the confidence floor, the
YAML table below it; the file SAGE loads, loaded as SAGE loads it in a bare process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import joblib
import numpy as np
import pytest

from sage_pipeline.rl import sage_router as sr
from sage_pipeline.rl.policy import check_probs
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.table import RoutingTable

TABLE = {"routing": {
    "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "codestral:22b",
              "fallback_triggers": ["task_complexity_score > 0.8", "primary_failure_count >= 2"]},
    "reviewer": {"primary": "qwen3:14b-q4_K_M", "fallback": "claude-sonnet-4-5"},
    "shell_chat": {"primary": "llama3.2:3b", "fallback": "qwen3:14b-q4_K_M",
                   "fallback_triggers": ["task_complexity_score > 0.5"]},
}}


@dataclass(frozen=True)
class RulePolicy:
    """A sage_binary policy: the fallback when complexity > 0.6 or after one primary failure
    (coder, shell_chat); the reviewer always takes its primary (a one-class role)."""

    space: ActionSpace
    name: str = "rule"

    @property
    def actions(self):
        return self.space.actions

    @property
    def role_mask(self):
        return self.space.mask

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        fb = (ctx.task_complexity_score > 0.6) | (ctx.primary_failure_count >= 1)
        fb &= ctx.role != self.space.role_index["reviewer"]
        out = np.zeros((len(ctx), len(self.actions)))
        rows = np.arange(len(ctx))
        out[rows, np.where(fb, self.space.fallback[ctx.role], self.space.primary[ctx.role])] = 1.0
        return out


@pytest.fixture(scope="module")
def table():
    return RoutingTable.from_dict(TABLE, source="sage/models.yaml")


@pytest.fixture(scope="module")
def space(table):
    return ActionSpace.build(table, [("coder", "qwen2.5-coder:1.5b")]).binary()


def contexts(space, n=3000, seed=0) -> Contexts:
    rng = np.random.default_rng(seed)
    pfc = rng.integers(0, 3, n)
    return Contexts(role=rng.integers(0, len(space.roles), n), task_complexity_score=rng.random(n),
                    prompt_tokens=np.full(n, np.nan), step=pfc, failure_count=pfc, primary_failure_count=pfc)


@pytest.fixture(scope="module")
def served(table, space):
    d = sr.distill(RulePolicy(space), contexts(space), space, sr.SageRouterConfig())
    return sr.ServedSagePolicy.from_distilled(d, table, space, 0.55, name="rule_served")


def test_distilled_trees_follow_the_policy_and_always_know_class_1(served, space):
    assert set(served.models) == {"coder", "reviewer", "shell_chat"}
    assert all(a > 0.99 for a in served.agreement.values())
    for clf in served.models.values():
        assert list(clf.classes_) == [0, 1]  # SAGE looks class 1 up, even for a one-class role
    # the reviewer's policy never falls back: its class-1 probability is exactly 0
    p = served.models["reviewer"].predict_proba([[0.9, 3]])
    assert p[0][1] == 0.0


def test_composite_is_a_policy_and_equals_sages_decision_rule(served, space, table):
    ctx = contexts(space, n=600, seed=1)
    probs = check_probs(served, ctx, served.action_probs(ctx))
    assert (probs[~space.mask[ctx.role]] == 0).all()
    chosen = probs.argmax(axis=1)
    yaml_choice = table.choose(space, ctx.role, ctx.task_complexity_score, ctx.primary_failure_count,
                               ctx.failure_count)
    for i in range(len(ctx)):
        role = space.roles[ctx.role[i]]
        want = served.decide(role, float(ctx.task_complexity_score[i]), int(ctx.primary_failure_count[i]),
                             space.actions[yaml_choice[i]])
        assert space.actions[chosen[i]] == want


def test_below_the_floor_the_yaml_choice_is_kept(served, space, table):
    ctx = contexts(space, n=400, seed=2)
    yaml_choice = table.choose(space, ctx.role, ctx.task_complexity_score, ctx.primary_failure_count,
                               ctx.failure_count)
    never = served.with_min_confidence(1.0 + 1e-9)  # no probability is that confident
    assert (never.action_probs(ctx).argmax(axis=1) == yaml_choice).all()
    always = served.with_min_confidence(0.0)
    agree = always.action_probs(ctx).argmax(axis=1) == RulePolicy(space).action_probs(ctx).argmax(axis=1)
    assert agree.mean() > 0.99
    # a role without a classifier keeps the YAML choice whatever the floor
    no_coder = sr.ServedSagePolicy(table, space, {k: v for k, v in served.models.items() if k != "coder"}, 0.0)
    coder = ctx.role == space.role_index["coder"]
    assert (no_coder.action_probs(ctx).argmax(axis=1)[coder] == yaml_choice[coder]).all()


SAGE_HOOK = textwrap.dedent("""
    import json, sys
    import joblib
    ckpt = joblib.load(sys.argv[1])
    floor = float(sys.argv[2])
    states = json.loads(sys.stdin.read())
    out = []
    for role, tcs, fc, yaml_choice, primary, fallback in states:
        clf = ckpt["models"].get(role)
        if clf is None:
            out.append(yaml_choice)
            continue
        try:
            proba = clf.predict_proba([[tcs, fc]])[0]
            p = float(proba[list(clf.classes_).index(1)])
        except Exception:
            out.append(yaml_choice)
            continue
        if abs(p - 0.5) * 2 < floor:
            out.append(yaml_choice)
        else:
            out.append(fallback if p >= 0.5 else primary)
    heavy = [m for m in ("sage_pipeline", "torch", "dagster") if m in sys.modules]
    print(json.dumps({"decisions": out, "feature_keys": ckpt["feature_keys"], "keys": sorted(ckpt),
                      "heavy_modules": heavy}))
""")


def test_sage_loads_the_file_unchanged_in_a_bare_process(served, space, table, tmp_path):
    path, manifest_path = sr.write_sage_checkpoint(tmp_path / "sage", served, {"source": "rule"})
    manifest = json.loads(manifest_path.read_text())
    assert manifest["sage_env"] == {"SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(path.resolve()),
                                    "SAGE_RL_MIN_CONFIDENCE": "0.55"}
    assert manifest["routes"]["coder"] == ["qwen2.5-coder:1.5b", "codestral:22b"]
    assert manifest["versions"]["scikit-learn"] and manifest["source"] == "rule"
    states = []
    for role in space.roles:
        route = table.routes[role]
        for tcs in np.linspace(0, 1, 41):
            for fc in range(4):
                i = space.role_index[role]
                fired = table.fallback_fires(np.array([i]), np.array([tcs]), np.array([fc]), np.array([fc]))[0]
                states.append([role, float(tcs), fc, route.fallback if fired else route.primary, route.primary,
                               route.fallback])
    proc = subprocess.run([sys.executable, "-c", SAGE_HOOK, str(path), str(served.min_confidence)],
                          input=json.dumps(states), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["heavy_modules"] == [] and got["keys"] == ["feature_keys", "models"]
    assert got["feature_keys"] == ["task_complexity_score", "failure_count"]
    ctx = Contexts(role=np.array([space.role_index[s[0]] for s in states]),
                   task_complexity_score=np.array([s[1] for s in states]), prompt_tokens=np.full(len(states), np.nan),
                   step=np.array([s[2] for s in states]), failure_count=np.array([s[2] for s in states]),
                   primary_failure_count=np.array([s[2] for s in states]))
    mine = [space.actions[a] for a in served.action_probs(ctx).argmax(axis=1)]
    assert got["decisions"] == mine
    assert sr.check_loads_as_sage(path, served, space) == 3 * 21 * 4


def test_a_checkpoint_for_another_table_is_refused_naming_the_difference(served, space, tmp_path):
    sr.write_sage_checkpoint(tmp_path / "sage", served, {})
    other = dict(TABLE["routing"], coder={"primary": "qwen2.5-coder:14b", "fallback": "codestral:22b"})
    other.pop("shell_chat")
    t2 = RoutingTable.from_dict({"routing": other}, source="other.yaml")
    with pytest.raises(ValueError) as err:
        sr.load_sage_checkpoint(tmp_path / "sage", t2, ActionSpace.build(t2).binary())
    msg = str(err.value)
    assert "role 'coder': checkpoint trained for primary/fallback qwen2.5-coder:1.5b/codestral:22b" in msg
    assert "the table other.yaml has qwen2.5-coder:14b/codestral:22b" in msg
    assert "role 'shell_chat' is not in the table other.yaml" in msg
    back = sr.load_sage_checkpoint(tmp_path / "sage", served.table, space)
    assert back.min_confidence == 0.55 and set(back.models) == set(served.models)


def test_a_changed_file_is_refused(served, space, tmp_path):
    path, _ = sr.write_sage_checkpoint(tmp_path / "sage", served, {})
    joblib.dump({"models": {}, "feature_keys": []}, path)
    with pytest.raises(ValueError, match="sha256 differs from manifest.json"):
        sr.load_sage_checkpoint(tmp_path / "sage", served.table, space)


@pytest.mark.parametrize("kwargs", [{"max_depth": 0}, {"min_confidence_grid": (0.5, 1.2)},
                                    {"min_confidence_grid": ()}])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        sr.SageRouterConfig(**kwargs)
