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

from sage_pipeline import artifacts
from sage_pipeline.rl import sage_router as sr
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.policy import check_probs
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


@dataclass(frozen=True)
class StepPolicy(RulePolicy):
    """Falls back when complexity > 0.8, or on odd steps when complexity > 0.3: SAGE's two
    inputs cannot see the step, so the trees' leaves for 0.3 < complexity <= 0.8 sit near 0.5."""

    name: str = "step"

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        tcs = ctx.task_complexity_score
        fb = (tcs > 0.8) | ((tcs > 0.3) & (ctx.step % 2 == 1))
        out = np.zeros((len(ctx), len(self.actions)))
        rows = np.arange(len(ctx))
        out[rows, np.where(fb, self.space.fallback[ctx.role], self.space.primary[ctx.role])] = 0.9
        out[rows, np.where(fb, self.space.primary[ctx.role], self.space.fallback[ctx.role])] += 0.1
        return out


@dataclass(frozen=True)
class AlwaysFallback(RulePolicy):
    name: str = "always_fallback"

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        out[np.arange(len(ctx)), self.space.fallback[ctx.role]] = 1.0
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
                    prompt_tokens=np.full(n, np.nan), step=pfc + rng.integers(0, 2, n), failure_count=pfc + 1,
                    primary_failure_count=pfc)


def grid(space, table, roles=None, n=41, counts=range(4)) -> tuple[list, Contexts]:
    """Every role x complexity x primary-failure count, with the YAML choice of each state."""
    states = []
    for role in roles or space.roles:
        route, i = table.routes[role], space.role_index[role]
        for tcs in np.linspace(0, 1, n):
            for fc in counts:
                fired = table.fallback_fires(np.array([i]), np.array([tcs]), np.array([fc]), np.array([fc]))[0]
                states.append([role, float(tcs), fc, route.fallback if fired else route.primary, route.primary,
                               route.fallback])
    m = len(states)
    fcs = np.array([s[2] for s in states])
    ctx = Contexts(role=np.array([space.role_index[s[0]] for s in states]),
                   task_complexity_score=np.array([s[1] for s in states]), prompt_tokens=np.full(m, np.nan),
                   step=fcs, failure_count=fcs, primary_failure_count=fcs)
    return states, ctx


@pytest.fixture(scope="module")
def served(table, space):
    d = sr.distill(RulePolicy(space), contexts(space), space, sr.SageRouterConfig())
    return sr.ServedSagePolicy.from_distilled(d, table, space, 0.55, name="rule_served")


@pytest.fixture(scope="module")
def noisy(table, space):
    d = sr.distill(StepPolicy(space), contexts(space, n=6000, seed=3), space, sr.SageRouterConfig())
    return sr.ServedSagePolicy.from_distilled(d, table, space, 0.55, name="step_served")


def test_sage_inputs_pass_the_primary_failure_count_as_sages_failure_count(space):
    ctx = contexts(space, n=50)
    x = sr.sage_inputs(ctx)
    assert x.dtype == np.float64 and x.shape == (50, 2)
    assert (x[:, 0] == ctx.task_complexity_score).all() and (x[:, 1] == ctx.primary_failure_count).all()
    assert (x[:, 1] != ctx.failure_count).all()  # the contexts' failure_count is pfc + 1: not what SAGE passes
    assert sr.FEATURE_KEYS == ("task_complexity_score", "failure_count")


def test_distilled_trees_follow_the_policy_and_always_know_class_1(served, space):
    assert set(served.models) == {"coder", "reviewer", "shell_chat"}
    assert all(a > 0.99 for a in served.agreement.values())
    ctx = contexts(space)
    assert served.rows == {r: int((ctx.role == space.role_index[r]).sum()) for r in space.roles}
    for clf in served.models.values():
        assert list(clf.classes_) == [0, 1]  # SAGE looks class 1 up, even for a one-class role
    # the reviewer's policy never falls back: its class-1 probability is exactly 0
    p = served.models["reviewer"].predict_proba([[0.9, 3]])
    assert p[0][1] == 0.0


def test_a_role_the_policy_always_sends_to_its_fallback_keeps_classes_0_1(table, space):
    d = sr.distill(AlwaysFallback(space), contexts(space, n=300), space, sr.SageRouterConfig())
    for role, clf in d.models.items():
        assert list(clf.classes_) == [0, 1]
        assert (clf.predict_proba([[0.0, 0], [1.0, 5]])[:, 1] == 1.0).all()
        assert d.agreement[role] == 1.0
    served = sr.ServedSagePolicy.from_distilled(d, table, space, 0.95)
    assert served.decide("coder", 0.0, 0, "qwen2.5-coder:1.5b") == "codestral:22b"


def test_a_role_whose_primary_is_its_fallback_gets_no_classifier():
    t = RoutingTable.from_dict({"routing": dict(TABLE["routing"], planner={"primary": "llama3.2:3b",
                                                                            "fallback": "llama3.2:3b"})})
    sp = ActionSpace.build(t).binary()
    d = sr.distill(AlwaysFallback(sp), contexts(sp, n=400), sp)
    assert "planner" not in d.models and set(d.models) == {"coder", "reviewer", "shell_chat"}


def test_distill_refuses_a_policy_of_another_action_space(space, table):
    other = ActionSpace.build(table, [("coder", "deepseek-coder-v2:16b")]).binary()
    with pytest.raises(ValueError, match="distill a policy trained on this routing dataset's action space"):
        sr.distill(RulePolicy(other), contexts(space, n=50), space)
    bad = contexts(space, n=5)
    bad = Contexts(**{**bad.__dict__, "role": np.array([0, 1, 2, 3, 7])})
    with pytest.raises(ValueError, match=r"role indices \[3, 7\] are not roles of the action space"):
        sr.distill(RulePolicy(space), bad, space)


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


@pytest.mark.parametrize("floor", [0.0, 0.2, 0.55, 0.95])
def test_noisy_composite_equals_sages_rule_on_a_grid_at_every_floor(noisy, space, table, floor):
    served = noisy.with_min_confidence(floor)
    assert noisy.min_confidence == 0.55 and served.min_confidence == floor  # a copy
    states, ctx = grid(space, table)
    mine = [space.actions[a] for a in check_probs(served, ctx, served.action_probs(ctx)).argmax(axis=1)]
    assert mine == [served.decide(r, tcs, fc, y) for r, tcs, fc, y, _, _ in states]


def test_the_floor_keeps_the_yaml_choice_where_the_tree_is_not_confident(noisy, space, table):
    states, ctx = grid(space, table, roles=["coder"])
    clf = noisy.models["coder"]
    p = clf.predict_proba(sr.sage_inputs(ctx))[:, 1]
    confident = np.abs(p - 0.5) * 2 >= 0.55
    assert confident.any() and (~confident).any()  # the step the trees cannot see leaves them unsure
    chosen = np.array(space.actions)[noisy.action_probs(ctx).argmax(axis=1)]
    yaml_choice = np.array([s[3] for s in states])
    tree_choice = np.where(p >= 0.5, "codestral:22b", "qwen2.5-coder:1.5b")
    assert (chosen[~confident] == yaml_choice[~confident]).all()
    assert (chosen[confident] == tree_choice[confident]).all()
    # at complexity 0.9 the policy always falls back: confident, so the fallback even with 0 failures
    assert noisy.decide("coder", 0.9, 0, "qwen2.5-coder:1.5b") == "codestral:22b"


def test_bad_served_policies_are_refused(served, table, space):
    with pytest.raises(ValueError, match="min_confidence must be a finite number >= 0"):
        served.with_min_confidence(float("nan"))
    with pytest.raises(ValueError, match="min_confidence must be a finite number >= 0"):
        served.with_min_confidence(-0.1)
    with pytest.raises(ValueError, match=r"classifiers for roles \['ghost'\]"):
        sr.ServedSagePolicy(table, space, {"ghost": served.models["coder"]})
    from sklearn.tree import DecisionTreeClassifier
    one_class = DecisionTreeClassifier().fit([[0.1, 0], [0.2, 1]], [0, 0])
    with pytest.raises(ValueError, match=r"role 'coder' has classes_ \[0\]"):
        sr.ServedSagePolicy(table, space, {"coder": one_class})


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


@pytest.mark.parametrize("which", ["served", "noisy"])
def test_sage_loads_the_file_unchanged_in_a_bare_process(which, request, space, table, tmp_path):
    served = request.getfixturevalue(which)
    path, manifest_path = sr.write_sage_checkpoint(tmp_path / "sage", served, {"source": which,
                                                                               "dataset_sha256": "abc"})
    manifest = json.loads(manifest_path.read_text())
    env = manifest["sage_env"]
    assert env == {"SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(path.resolve()),
                   "SAGE_RL_MIN_CONFIDENCE": "0.55"}
    states, ctx = grid(space, table)
    # SAGE reads its floor from the environment variable the manifest gives
    proc = subprocess.run([sys.executable, "-c", SAGE_HOOK, env["SAGE_RL_CHECKPOINT"], env["SAGE_RL_MIN_CONFIDENCE"]],
                          input=json.dumps(states), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["heavy_modules"] == [] and got["keys"] == ["feature_keys", "models"]
    assert got["feature_keys"] == ["task_complexity_score", "failure_count"]
    mine = [space.actions[a] for a in served.action_probs(ctx).argmax(axis=1)]
    assert got["decisions"] == mine
    assert sr.check_loads_as_sage(path, served, space) == 3 * 21 * 4


def test_the_manifest_says_what_was_written(served, tmp_path):
    path, manifest_path = sr.write_sage_checkpoint(tmp_path / "sage", served.with_min_confidence(0.7),
                                                   {"source": "checkpoints/bc_sage_binary", "dataset_sha256": "abc"})
    m = json.loads(manifest_path.read_text())
    assert m["format"] == "sage_router_joblib" and m["feature_keys"] == ["task_complexity_score", "failure_count"]
    assert m["min_confidence"] == 0.7 and m["sage_env"]["SAGE_RL_MIN_CONFIDENCE"] == "0.7"
    assert m["roles"] == ["coder", "reviewer", "shell_chat"]
    assert m["routes"] == {"coder": ["qwen2.5-coder:1.5b", "codestral:22b"],
                           "reviewer": ["qwen3:14b-q4_K_M", "claude-sonnet-4-5"],
                           "shell_chat": ["llama3.2:3b", "qwen3:14b-q4_K_M"]}
    assert m["agreement"] == served.agreement and m["rows"] == served.rows
    assert set(m["versions"]) == {"python", "numpy", "scikit-learn", "joblib"}
    assert m["sha256"] == artifacts.file_sha256(path)
    assert (m["source"], m["dataset_sha256"]) == ("checkpoints/bc_sage_binary", "abc")
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.json", "policy.joblib"]  # no temp left
    assert set(joblib.load(path)) == {"models", "feature_keys"}
    # loads back from the folder or from the file SAGE_RL_CHECKPOINT names
    for where in (path.parent, path):
        back = sr.load_sage_checkpoint(where, served.table, served.space)
        assert back.min_confidence == 0.7 and back.rows == served.rows


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
    path, manifest_path = sr.write_sage_checkpoint(tmp_path / "sage", served, {})
    joblib.dump({"models": {}, "feature_keys": []}, path)
    with pytest.raises(ValueError, match="sha256 differs from manifest.json"):
        sr.load_sage_checkpoint(tmp_path / "sage", served.table, space)
    # a file with other feature keys, even with a matching hash
    obj = sr.to_sage_dict(served)
    joblib.dump({**obj, "feature_keys": ["failure_count", "task_complexity_score"]}, path)
    m = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**m, "sha256": artifacts.file_sha256(path)}))
    with pytest.raises(ValueError, match="feature_keys .* differ from SAGE's"):
        sr.load_sage_checkpoint(tmp_path / "sage", served.table, space)
    manifest_path.write_text(json.dumps({**m, "format": "something_else"}))
    with pytest.raises(ValueError, match="format 'something_else', expected 'sage_router_joblib'"):
        sr.load_sage_checkpoint(tmp_path / "sage", served.table, space)
    with pytest.raises(FileNotFoundError, match="holds no SAGE router checkpoint"):
        sr.load_sage_checkpoint(tmp_path / "empty", served.table, space)


@pytest.mark.parametrize("kwargs", [{"max_depth": 0}, {"min_confidence_grid": (0.5, 1.2)},
                                    {"min_confidence_grid": ()}])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        sr.SageRouterConfig(**kwargs)


def _write_and_die_before_the_manifest(directory, served) -> None:
    import os

    def die(*args, **kwargs):
        os._exit(77)

    artifacts.write_json = die  # killed (no clean-up) once policy.joblib is written, before manifest.json
    sr.write_sage_checkpoint(directory, served, {"source": "the second save"})
    os._exit(0)


def test_a_save_killed_between_its_two_files_leaves_the_old_checkpoint_whole(served, noisy, space, tmp_path):
    """policy.joblib and manifest.json are one checkpoint: a kill after the first file left the new
    policy.joblib beside the old manifest, which then refused it (found by reading after the
    fault-injection run; the window is too short for its random kills)."""
    import multiprocessing

    sr.write_sage_checkpoint(tmp_path / "sage", served.with_min_confidence(0.7), {"source": "the first save"})
    (tmp_path / "first.joblib").write_bytes((tmp_path / "sage" / "policy.joblib").read_bytes())
    child = multiprocessing.get_context("fork").Process(target=_write_and_die_before_the_manifest,
                                                        args=(tmp_path / "sage", noisy))  # other trees
    child.start()
    child.join(60)
    assert child.exitcode == 77
    back = sr.load_sage_checkpoint(tmp_path / "sage", served.table, space)  # the sha256 matches
    assert back.min_confidence == 0.7 and sr.read_manifest(tmp_path / "sage")["source"] == "the first save"
    assert joblib.load(tmp_path / "sage" / "policy.joblib")["models"].keys() == served.models.keys()
    assert artifacts.file_sha256(tmp_path / "sage" / "policy.joblib") == artifacts.file_sha256(
        tmp_path / "first.joblib")
    sr.write_sage_checkpoint(tmp_path / "sage", served, {"source": "the third save"})
    assert sr.load_sage_checkpoint(tmp_path / "sage", served.table, space).min_confidence == 0.55
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.joblib", "sage"]  # the killed save's temp: swept
