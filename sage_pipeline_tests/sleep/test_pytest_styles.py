"""Test modules in the ten styles models write when SAGE's test engineer asks for pytest tests (its template,
prompt_engine/templates/test_engineer.md: pytest, FastAPI's TestClient), judged as the harvest and the night judge
them: read by the harvest (sleep/sage_harvest.py read_gate_tests), unchanged, run by SAGE's verification command
in the Docker sandbox with its limits and no network (sim/runner.py, "workspace jobs"). Each style's module passes
a right implementation and fails a wrong one. Issue 48 measured 2 of these 10 judged before (the conversion to
standard-library checks refused the rest)."""

from __future__ import annotations

import pytest

from sage_pipeline.sim.sandbox import SandboxConfig
from sage_pipeline.sleep.records import TaskRecord, normalise_reference
from sage_pipeline.sleep.sage_harvest import gate_command, read_gate_tests, untrusted_judge
from sage_pipeline_tests.sim.sandbox_fixtures import docker_ready  # noqa: F401 - the Docker sandbox's fixture

INVENTORY = '''"""A small inventory."""
import json
import os


def add_item(stock, name, qty):
    if qty <= 0:
        raise ValueError("qty must be positive")
    out = dict(stock)
    out[name] = out.get(name, 0) + qty
    return out


def total(prices, qty):
    return round(sum(prices[k] * n for k, n in qty.items()), 2)


def load_stock(path):
    with open(path, encoding="utf-8") as fh:
        return {k: int(v) for k, v in json.load(fh).items()}


def threshold():
    return int(os.environ.get("MIN_STOCK", "5"))
'''
# wrong in every function: no check of qty, a cent lost, the file's counts as read, the default threshold
WRONG_INVENTORY = (INVENTORY.replace('    if qty <= 0:\n        raise ValueError("qty must be positive")\n', "")
                   .replace("round(sum(prices[k] * n for k, n in qty.items()), 2)",
                            "round(sum(prices[k] * n for k, n in qty.items()) - 0.01, 2)")
                   .replace("{k: int(v) for k, v in json.load(fh).items()}", "json.load(fh)")
                   .replace('os.environ.get("MIN_STOCK", "5")', '"5"'))
APP = '''from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()
ITEMS = {}


class Item(BaseModel):
    name: str
    qty: int


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/items")
def add(item: Item):
    ITEMS[item.name] = ITEMS.get(item.name, 0) + item.qty
    return {"name": item.name, "qty": ITEMS[item.name]}
'''
WRONG_APP = APP.replace("ITEMS.get(item.name, 0) + item.qty", "item.qty")

STYLES = {  # kind -> (the test module, as a model writes it)
    "fixtures": '''import pytest

from inventory import add_item, total


@pytest.fixture
def stock():
    return {"apple": 2}


@pytest.fixture
def prices():
    return {"apple": 0.1}


def test_add_to_existing(stock):
    assert add_item(stock, "apple", 3) == {"apple": 5}
    assert stock == {"apple": 2}


def test_total_of_the_stock(stock, prices):
    assert total(prices, add_item(stock, "apple", 1)) == 0.3
''',
    "raises": '''import pytest

from inventory import add_item


def test_rejects_non_positive_quantities():
    with pytest.raises(ValueError, match="positive"):
        add_item({}, "apple", 0)
''',
    "parametrize": '''import pytest

from inventory import total


@pytest.mark.parametrize("prices, qty, expected", [
    ({"a": 1.5}, {"a": 2}, 3.0),
    ({"a": 0.1, "b": 0.2}, {"a": 1, "b": 1}, 0.3),
    ({}, {}, 0),
])
def test_total(prices, qty, expected):
    assert total(prices, qty) == expected
''',
    "classes": '''from inventory import add_item, threshold


class TestInventory:
    def setup_method(self):
        self.stock = {"pear": 1}

    def test_new_item(self):
        assert add_item(self.stock, "fig", 4) == {"pear": 1, "fig": 4}

    def test_refuses_zero(self):
        try:
            add_item(self.stock, "fig", 0)
        except ValueError:
            return
        raise AssertionError("accepted a quantity of 0")
''',
    "tmp_path": '''import json

from inventory import load_stock


def test_load_stock(tmp_path):
    path = tmp_path / "stock.json"
    path.write_text(json.dumps({"apple": "3"}))
    assert load_stock(path) == {"apple": 3}
''',
    "monkeypatch": '''from inventory import threshold


def test_threshold_from_env(monkeypatch):
    monkeypatch.setenv("MIN_STOCK", "12")
    assert threshold() == 12


def test_threshold_default(monkeypatch):
    monkeypatch.delenv("MIN_STOCK", raising=False)
    assert threshold() == 5
''',
    "approx": '''import pytest

from inventory import total


def test_total_of_cents():
    assert total({"a": 0.1, "b": 0.2}, {"a": 3, "b": 1}) == pytest.approx(0.5)
''',
    # SAGE's own template's example, widened: sys.path.insert(0, "src"), then the app's module
    "testclient": '''import sys
sys.path.insert(0, "src")

from fastapi.testclient import TestClient
import app as app_mod


def test_health():
    c = TestClient(app_mod.app)
    r = c.get("/health")
    assert r.status_code == 200
    assert r.json().get("status") == "ok"


def test_items_add_up():
    c = TestClient(app_mod.app)
    assert c.post("/items", json={"name": "apple", "qty": 2}).json() == {"name": "apple", "qty": 2}
    assert c.post("/items", json={"name": "apple", "qty": 3}).json()["qty"] == 5
''',
    "unittest": '''import unittest

from inventory import add_item


class TestAddItem(unittest.TestCase):
    def setUp(self):
        self.stock = {}

    def test_add(self):
        self.assertEqual(add_item(self.stock, "kiwi", 1), {"kiwi": 1})

    def test_zero(self):
        with self.assertRaises(ValueError):
            add_item(self.stock, "kiwi", 0)


if __name__ == "__main__":
    unittest.main()
''',
    "plain": '''from inventory import add_item, total


def test_add_and_total():
    stock = add_item({}, "apple", 2)
    assert stock == {"apple": 2}
    assert total({"apple": 0.5}, stock) == 1.0
''',
}


def _record(kind: str) -> TaskRecord:
    """The task the harvest makes of a gate's test file (sleep/sage_harvest.py): the file unchanged, SAGE's file for
    the code, SAGE's gate command."""
    artifact = "src/app.py" if kind == "testclient" else "inventory.py"
    test_file = f"tests/test_{artifact.rsplit('/', 1)[-1][:-3]}.py"
    source = STYLES[kind]
    gate = read_gate_tests(source, artifact)
    assert gate.asserts >= 1, kind
    ref = normalise_reference("unit_tests", {"entry_point": gate.entry_point, "timeout_s": 20.0, "tests": [
        {"command": gate_command(test_file), "code_file": artifact, "files": {test_file: source}}]})
    return TaskRecord(f"style/{kind}", f"the {kind} style", "unit_tests", ref)


@pytest.mark.usefixtures("docker_ready")
def test_every_style_is_judged_in_the_docker_sandbox_right_passes_wrong_fails():
    judge = untrusted_judge("docker", workers=2)
    items = []
    for kind in STYLES:
        rec = _record(kind)
        right, wrong = (APP, WRONG_APP) if kind == "testclient" else (INVENTORY, WRONG_INVENTORY)
        items += [(rec, right), (rec, wrong)]
    try:
        verdicts = judge.run(items, raw=True)
        described = judge.describe()
        sandbox = judge._sb.describe()
    finally:
        judge.close()
    judged = {}
    for (rec, _), v in zip(items, verdicts, strict=True):
        judged.setdefault(rec.id.split("/")[1], []).append(v)
    right_wrong = {kind: (vs[0].hard, vs[1].hard) for kind, vs in judged.items()}
    assert right_wrong == {kind: (1.0, 0.0) for kind in STYLES}, {k: [v.why for v in vs] for k, vs in judged.items()}
    assert sum(rw == (1.0, 0.0) for rw in right_wrong.values()) >= 9  # issue 48's bar: 9 of the 10 kinds
    for kind, (_, wrong) in judged.items():  # the wrong one failed its tests, not the collection
        assert wrong.why.startswith("wrong_answer: python -m pytest -q tests/test_"), (kind, wrong.why)
    # the sandbox as it always was: isolated, no network, its limits unchanged
    assert described["untrusted"] and described["isolated"] and sandbox["isolated"]
    defaults = SandboxConfig()
    for name in ("memory_mb", "task_memory_mb", "pids_limit", "cpus", "tmpfs_mb", "image"):
        assert sandbox[name] == getattr(defaults, name), name


@pytest.mark.usefixtures("docker_ready")
def test_the_sandbox_has_no_network_and_its_limits_as_the_tests_see_them():
    source = '''import os
import resource
import socket

import pytest

from inventory import total


def test_no_network_only_loopback():
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    with pytest.raises(OSError):
        socket.create_connection(("deb.debian.org", 80), timeout=2)
    assert total({}, {}) == 0


def test_limits():
    assert resource.getrlimit(resource.RLIMIT_AS)[1] == %d
    assert os.getuid() == 65534
''' % (SandboxConfig().task_memory_mb << 20)
    STYLES["network"] = source
    try:
        rec = _record("network")
    finally:
        del STYLES["network"]
    judge = untrusted_judge("docker")
    try:
        (v,) = judge.run([(rec, INVENTORY)], raw=True)
    finally:
        judge.close()
    assert v.hard == 1.0, v.why


@pytest.mark.parametrize("kind", ["raises", "testclient"])
def test_the_harvest_reads_each_style_as_written(kind):
    rec = _record(kind)
    (spec,) = rec.reference["tests"]
    assert list(spec["files"].values()) == [STYLES[kind]]  # never rewritten
    assert rec.reference["entry_point"] == ("app" if kind == "testclient" else "add_item")
