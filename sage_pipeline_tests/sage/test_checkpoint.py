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
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.policy import check_probs
from sage_pipeline.sage import checkpoint as sr
from sage_pipeline.sage.table import RoutingTable

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
    """Every role x complexity x primary-failure count, with SAGE's YAML choice of each state
    (the reviewer has no triggers: SAGE's back-compat rule, failure_count >= 2 or score > 0.8)."""
    states = []
    for role in roles or space.roles:
        route = table.routes[role]
        for tcs in np.linspace(0, 1, n):
            for fc in counts:
                states.append([role, float(tcs), fc, sr.yaml_choice(route, float(tcs), fc), route.primary,
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
    for i in range(len(ctx)):
        role = space.roles[ctx.role[i]]
        want = served.decide(role, float(ctx.task_complexity_score[i]), int(ctx.primary_failure_count[i]))
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


def sage_yaml(space, table, ctx) -> np.ndarray:
    """SAGE's YAML choice per row (its failure count is the primary failure count)."""
    return np.array([space.index[sr.yaml_choice(table.routes[space.roles[r]], s, f)]
                     for r, s, f in zip(ctx.role, ctx.task_complexity_score, ctx.primary_failure_count)])


def test_below_the_floor_the_yaml_choice_is_kept(served, space, table):
    ctx = contexts(space, n=400, seed=2)
    yaml_choice = sage_yaml(space, table, ctx)
    never = served.with_min_confidence(1.0 + 1e-9)  # no probability is that confident
    assert (never.action_probs(ctx).argmax(axis=1) == yaml_choice).all()
    always = served.with_min_confidence(0.0)
    agree = always.action_probs(ctx).argmax(axis=1) == RulePolicy(space).action_probs(ctx).argmax(axis=1)
    assert agree.mean() > 0.99


def test_a_role_without_a_classifier_is_modelled_as_sage_routes_it(served, space, table):
    """SAGE gives a role without a classifier (p 0, confidence 0): YAML while the floor is > 0,
    its primary at a floor of 0 (0 >= 0), which the manifest's old floor of 0 did to shell_chat."""
    ctx = contexts(space, n=400, seed=2)
    yaml_choice = sage_yaml(space, table, ctx)
    coder = ctx.role == space.role_index["coder"]
    no_coder = sr.ServedSagePolicy(table, space, {k: v for k, v in served.models.items() if k != "coder"}, 0.0)
    assert no_coder.uncovered_roles() == ["coder"]
    chosen = no_coder.action_probs(ctx).argmax(axis=1)
    assert (chosen[coder] == space.primary[space.role_index["coder"]]).all()
    assert (yaml_choice[coder] != chosen[coder]).any()
    assert no_coder.decide("coder", 0.9, 3) == "qwen2.5-coder:1.5b"
    assert no_coder.with_min_confidence(0.01).decide("coder", 0.9, 3) == "codestral:22b"
    # the fix: the role's YAML as a classifier, so every floor keeps it
    fixed = no_coder.with_every_role()
    assert fixed.yaml_roles == ("coder",) and fixed.uncovered_roles() == []
    for floor in (0.0, 0.55, 1.0):
        got = fixed.with_min_confidence(floor).action_probs(ctx).argmax(axis=1)
        assert (got[coder] == yaml_choice[coder]).all()
    d = sr.distill(RulePolicy(space), contexts(space).take(np.flatnonzero(contexts(space).role != 0)), space)
    assert "coder" not in d.models
    assert sr.ServedSagePolicy.from_distilled(d, table, space, 0.0).yaml_roles == ("coder",)


def test_a_floor_of_0_with_a_role_without_a_classifier_is_not_written(served, space, table, tmp_path):
    no_coder = sr.ServedSagePolicy(table, space, {k: v for k, v in served.models.items() if k != "coder"}, 0.0)
    with pytest.raises(ValueError, match=r"roles \['coder'\] would leave their YAML.*with_every_role\(\)"):
        sr.write_sage_checkpoint(tmp_path / "sage", no_coder, {})
    assert not (tmp_path / "sage").exists()
    sr.write_sage_checkpoint(tmp_path / "sage", no_coder.with_min_confidence(0.1), {})  # a floor > 0 keeps YAML
    sr.write_sage_checkpoint(tmp_path / "sage", no_coder.with_every_role(), {})
    assert sr.read_manifest(tmp_path / "sage")["yaml_roles"] == ["coder"]


@pytest.mark.parametrize("triggers", [["task_complexity_score > 0.8"], ["task_complexity_score >= 0.8"],
                                      ["task_complexity_score < 0.3", "primary_failure_count == 2"],
                                      ["failure_count != 1", "task_complexity_score <= 0.45"], []])
def test_the_yaml_classifier_is_sages_rule_exactly_even_beside_a_boundary(triggers):
    """scikit-learn's trees see float32: a tree alone cannot tell 0.8 from 0.8000000000000002."""
    t = RoutingTable.from_dict({"routing": {"coder": {"primary": "a", "fallback": "b", "fallback_triggers": triggers}}})
    route = t.routes["coder"]
    clf = sr.yaml_classifier(route)
    near = [f(b) for b in (0.3, 0.45, 0.8) for f in (lambda b: b, lambda b: np.nextafter(b, 0),
                                                     lambda b: np.nextafter(b, 1))]
    s = np.concatenate([np.linspace(-1, 2, 301), near, [0.1 + 0.7, 0.8000000000000002, 1e-300]])
    for fc in (0, 1, 1.5, 2, 2.0000000000000004, 3, 7):
        x = np.column_stack([s, np.full(len(s), fc)])
        assert np.array_equal(clf.predict_proba(x)[:, 1], sr.yaml_fallback(route, s, fc).astype(float)), fc
    assert list(clf.classes_) == [0, 1]


def test_the_manifest_names_the_table_and_writing_for_another_is_refused(served, space, table, tmp_path):
    import yaml

    path = tmp_path / "models.yaml"
    path.write_text("# SAGE's table\n" + yaml.safe_dump(TABLE))
    on_disk = RoutingTable.load(path)
    served_file = sr.ServedSagePolicy(on_disk, space, dict(served.models), 0.55)
    _, manifest_path = sr.write_sage_checkpoint(tmp_path / "sage", served_file, {}, sage_table=path)
    m = json.loads(manifest_path.read_text())["sage_table"]
    assert m["path"] == str(path.resolve()) and m["sha256"] == artifacts.file_sha256(path)
    assert m["roles"] == ["coder", "reviewer", "shell_chat"] and m["routing"]["coder"]["fallback"] == "codestral:22b"
    # the routing section's hash is the content's, whatever the file's comments
    assert m["routing_sha256"] == sr.table_digest(table)["routing_sha256"]
    assert json.loads(manifest_path.read_text())["sage_env"]["SAGE_MODELS_YAML"] == str(path.resolve())
    other = dict(TABLE["routing"], coder={**TABLE["routing"]["coder"], "fallback": "qwen3:14b-q4_K_M"},
                 shell_chat={**TABLE["routing"]["shell_chat"], "fallback_triggers": ["task_complexity_score > 0.6"]},
                 debugger={"primary": "a", "fallback": "b"})
    (tmp_path / "sage_models.yaml").write_text(yaml.safe_dump({"routing": other}))
    with pytest.raises(ValueError) as err:
        sr.write_sage_checkpoint(tmp_path / "sage", served_file, {}, sage_table=tmp_path / "sage_models.yaml")
    msg = str(err.value)
    assert "role 'coder': primary/fallback qwen2.5-coder:1.5b/codestral:22b in the checkpoint's table, " \
           "qwen2.5-coder:1.5b/qwen3:14b-q4_K_M in SAGE's" in msg
    assert "role 'shell_chat': fallback_triggers ['task_complexity_score > 0.5'] in the checkpoint's table, " \
           "['task_complexity_score > 0.6'] in SAGE's" in msg
    assert "role 'debugger' of SAGE's table is not in the checkpoint's" in msg
    assert f"SAGE_ROUTING_TABLE={tmp_path / 'sage_models.yaml'}" in msg and f"SAGE_MODELS_YAML={path}" in msg
    assert json.loads(manifest_path.read_text())["sha256"] == artifacts.file_sha256(tmp_path / "sage" / "policy.joblib")


SAGE_HOOK = textwrap.dedent("""
    import json, sys
    import joblib
    ckpt = joblib.load(sys.argv[1])
    floor = float(sys.argv[2])
    states = json.loads(sys.stdin.read())
    out = []
    for role, tcs, fc, yaml_choice, primary, fallback in states:
        clf = ckpt["models"].get(role)
        if clf is None:  # SAGE: p 0 at confidence 0
            out.append(yaml_choice if 0.0 < floor else primary)
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
    assert set(manifest["sage_table"]) == {"path", "sha256", "routing_sha256", "roles", "routing"}
    assert manifest["kind"] == "deterministic" and manifest["yaml_roles"] == []


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


def test_the_same_trees_dump_to_the_same_bytes_whatever_their_padding_held():
    """A tree's node records have padding scikit-learn never writes: two fits of the same tree pickled
    to different bytes (a Celery worker's and an in-process run's policy.joblib differed, so the ledger
    saw two candidates). The checkpoint zeroes it: garbage written into the padding of one copy gives
    the same dump as the clean copy (dump_policy: a plain pickle, not joblib's buffered writer, which
    leaves the padding as its buffer held it), SAGE's joblib.load reads it, the predictions unchanged."""
    import copy as _copy
    import io
    import pickle
    from types import SimpleNamespace

    import joblib as _joblib
    from sklearn.tree import DecisionTreeClassifier as _Tree

    from sage_pipeline.sage import checkpoint as ck

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(ck.FEATURE_KEYS)))
    y = (x[:, 0] + 0.3 * rng.normal(size=400) > 0).astype(int)
    fitted = _Tree(max_depth=4, random_state=0).fit(x, y)
    dirty = _copy.deepcopy(fitted)
    state = dirty.tree_.__getstate__()
    nodes = state["nodes"]
    assert nodes.dtype.itemsize > sum(nodes.dtype.fields[n][0].itemsize for n in nodes.dtype.names), (
        "the node record has no padding in this scikit-learn: the test would prove nothing")
    raw = np.frombuffer(rng.bytes(nodes.nbytes), dtype=nodes.dtype).copy()
    for name in nodes.dtype.names:
        raw[name] = nodes[name]
    dirty.tree_.__setstate__({**state, "nodes": raw})

    def dump(model) -> bytes:
        buf = io.BytesIO()
        ck.dump_policy(SimpleNamespace(models={"coder": model}), buf)
        return buf.getvalue()

    def plain(model) -> bytes:
        buf = io.BytesIO()
        pickle.dump({"m": model}, buf, protocol=4)
        return buf.getvalue()

    assert plain(dirty) != plain(fitted)  # the padding really differs before
    assert dump(dirty) == dump(fitted)
    assert np.array_equal(ck.canonical_tree(dirty).predict_proba(x), fitted.predict_proba(x))
    assert ck.canonical_tree("not a tree") == "not a tree"
    # SAGE reads it with joblib.load, as it reads joblib's own files
    back = _joblib.load(io.BytesIO(dump(dirty)))
    assert back["feature_keys"] == list(ck.FEATURE_KEYS)
    assert np.array_equal(back["models"]["coder"].predict_proba(x), fitted.predict_proba(x))


def test_the_same_trees_dump_to_the_same_bytes_whether_fitted_here_or_read_back():
    """The pickler's memo writes a string once when two references are one object and twice when they
    are equal copies: a fitted model's attribute names are interned (the tree's own state shares them),
    a model read back from a pickle holds copies, so the same trees gave two policy.joblib (a Celery
    worker's and an in-process run's: two router candidates in the ledger). dump_policy writes without
    the memo: the bytes depend on the values alone, SAGE's joblib.load reads them."""
    import io
    import pickle
    from types import SimpleNamespace

    import joblib as _joblib
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer
    from sklearn.tree import DecisionTreeClassifier as _Tree

    from sage_pipeline.sage import checkpoint as ck

    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, len(ck.FEATURE_KEYS)))
    y = (x[:, 1] > 0.2).astype(int)
    models = {"coder": _Tree(max_depth=3, random_state=0).fit(x, y),
              "planner": Pipeline([("cells", FunctionTransformer(np.round)),
                                   ("tree", _Tree(random_state=0))]).fit(x, y)}
    read_back = pickle.loads(pickle.dumps(models, protocol=4))  # copies of every name, as a worker holds them

    def memo(m) -> bytes:
        return pickle.dumps({"models": m, "feature_keys": list(ck.FEATURE_KEYS)}, protocol=4)

    def dump(m) -> bytes:
        buf = io.BytesIO()
        ck.dump_policy(SimpleNamespace(models=m), buf)
        return buf.getvalue()

    assert memo(models) != memo(read_back)  # with the memo the two differ: the test would prove nothing else
    assert dump(models) == dump(read_back)
    assert dump(read_back) == dump(pickle.loads(pickle.dumps(read_back, protocol=4)))
    back = _joblib.load(io.BytesIO(dump(read_back)))
    for role, m in models.items():
        assert np.array_equal(back["models"][role].predict_proba(x), m.predict_proba(x)), role
