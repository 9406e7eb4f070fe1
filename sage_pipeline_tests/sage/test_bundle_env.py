"""The env file a deploy writes is shell text the project generates from paths it did not choose (the
deploy root's name): every value is quoted with shlex.quote, the file holds only comments, ``unset NAME``
and ``export NAME=<quoted>`` lines, and read_env_file parses that grammar and nothing else (issue 49,
item 2)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bundle as bd, checkpoint as sr, explore as se
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable

# a deploy root's name holding everything a shell treats specially; a newline where the filesystem allows
HOSTILE = "dep loy 'q' \"dq\" $(touch canary) `touch canary2` ;touch canary3; $HOME \\ *"
VARS = ("SAGE_MODELS_YAML", "SAGE_RL_POLICY", "SAGE_RL_CHECKPOINT", "SAGE_RL_MIN_CONFIDENCE", "SAGE_SKILLS_ROOT",
        "LD_PRELOAD")
NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


@pytest.fixture(scope="module")
def sage_table() -> RoutingTable:
    return RoutingTable.load(SAGE_TABLE)


@pytest.fixture()
def built(sage_table, tmp_path) -> bd.Bundle:
    ex = se.build_exploring(sage_table, ActionSpace.build(sage_table).binary(), se.ExploreConfig(rate=0.2))
    sr.write_sage_checkpoint(tmp_path / "ck", ex, {"source": "test"})
    skills = tmp_path / "skills-src" / "discipline" / "tdd"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("# TDD\n")
    return bd.build(tmp_path / "bundle", sage_table, sage_table, objective=TaskObjective(),
                    checkpoint=tmp_path / "ck", skills=tmp_path / "skills-src")


def _hostile_root(tmp_path: Path) -> Path:
    base = tmp_path / "roots"
    base.mkdir()
    try:
        (base / (HOSTILE + "\nnext line")).mkdir()
        (base / (HOSTILE + "\nnext line")).rmdir()
        return base / (HOSTILE + "\nnext line")
    except OSError:  # a filesystem that refuses a newline in a name
        return base / HOSTILE


def _sourced(env_file: Path, cwd: Path) -> dict[str, str]:
    """What bash has after ``set -e; . env_file``: each of VARS, NUL-separated."""
    script = 'set -e; unset LD_PRELOAD; . "$1"; printf "%s\\0" ' + " ".join(f'"${v}"' for v in VARS)
    out = subprocess.run(["bash", "-c", script, "bash", str(env_file)], cwd=cwd, capture_output=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "HOME": str(cwd)})
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr == b"", out.stderr.decode()
    return dict(zip(VARS, out.stdout.decode().split("\0")[:-1], strict=True))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_a_hostile_deploy_root_is_sourced_back_exactly_and_runs_nothing(built, sage_table, tmp_path):
    root = _hostile_root(tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    line = bd.deploy(built, root, target=sage_table)
    version = Path(os.path.abspath(root)) / "versions" / built.id
    got = _sourced(root / bd.ENV_FILE, cwd)
    assert got["SAGE_MODELS_YAML"] == str(version / bd.MODELS_YAML)
    assert got["SAGE_RL_CHECKPOINT"] == str(version / bd.CHECKPOINT_DIR / sr.JOBLIB_NAME)
    assert got["SAGE_SKILLS_ROOT"] == str(version / bd.SKILLS_DIR)
    assert got["SAGE_RL_POLICY"] == "1" and got["LD_PRELOAD"] == ""
    assert Path(got["SAGE_MODELS_YAML"]).is_file() and Path(got["SAGE_RL_CHECKPOINT"]).is_file()
    assert not any(p.name.startswith("canary") for p in [*cwd.iterdir(), *tmp_path.iterdir()])  # nothing ran
    # the project's parser reads the same values, and the record says the same
    assert bd.read_env_file(root / bd.ENV_FILE) == {k: v for k, v in got.items() if v} == line["env"]


def test_the_env_file_holds_only_comments_unsets_and_quoted_exports(built, sage_table, tmp_path):
    root = _hostile_root(tmp_path)
    bd.deploy(built, root, target=sage_table)
    text = (root / bd.ENV_FILE).read_text()
    # split as the shell does: a newline inside quotes is part of the value
    statements, buf = [], ""
    for piece in text.split("\n"):
        buf = piece if not buf else buf + "\n" + piece
        try:
            shlex.split(buf, comments=True)
        except ValueError:  # an open quote: the statement goes on
            continue
        statements.append(buf)
        buf = ""
    assert buf == "" and statements[-1] == ""
    for s in statements[:-1]:
        if s.startswith("#"):
            assert "\n" not in s, s  # a comment is one line: nothing of the root's name is in it
            continue
        if s.startswith("unset "):
            assert NAME.fullmatch(s[len("unset "):]), s
            continue
        assert s.startswith("export "), s
        name, _, value = s[len("export "):].partition("=")
        assert NAME.fullmatch(name), s
        words = shlex.split(value)
        assert len(words) == 1 and value == shlex.quote(words[0]), s  # exactly what shlex.quote writes


@pytest.mark.parametrize("line", [
    "export SAGE_MODELS_YAML=$(touch canary)",
    "export SAGE_MODELS_YAML=`touch canary`",
    'export SAGE_MODELS_YAML="/a/b"',
    "export SAGE_MODELS_YAML=/a/b; touch canary",
    "export SAGE_MODELS_YAML='/a/b'x'",
    "export SAGE_MODELS_YAML='/a/b",
    "export sage_models_yaml=/a/b",
    "export 1SAGE=/a/b",
    "LD_PRELOAD=/tmp/evil.so",
    "touch canary",
    "export SAGE_MODELS_YAML=/a/b LD_PRELOAD=/tmp/evil.so",
    "  export SAGE_MODELS_YAML=/a/b",
])
def test_read_env_file_refuses_anything_outside_its_grammar_naming_file_and_line(tmp_path, line):
    p = tmp_path / "sage.env"
    p.write_text("# a comment\nexport SAGE_RL_POLICY=1\n" + line + "\n")
    with pytest.raises(bd.BundleError) as info:
        bd.read_env_file(p)
    assert f"{p}:3" in str(info.value) and "shlex.quote" in str(info.value)


def test_read_env_file_reads_what_shlex_quote_writes(tmp_path):
    values = {"SAGE_A": "plain/path.yaml", "SAGE_B": "it's a $(x) `y` \"z\"\nnext", "SAGE_C": "", "_X1": "'"}
    p = tmp_path / "sage.env"
    p.write_text("# c\nunset SAGE_D\n\n" + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items()))
    assert bd.read_env_file(p) == values


def test_the_cli_prints_quoted_exports(built, sage_table, tmp_path, capsys):
    root = _hostile_root(tmp_path)
    env = tmp_path / "target.env"
    env.write_text(f"export SAGE_MODELS_YAML={shlex.quote(str(SAGE_TABLE))}\n")
    assert bd.main(["deploy", str(built.folder), str(root), "--target-env", str(env), "--sage-python", ""]) == 0
    out = capsys.readouterr().out
    exports = out[out.index("export "):]
    got = dict(w.split("=", 1) for w in shlex.split(exports) if w != "export")
    assert got == bd.read_env_file(root / bd.ENV_FILE)
