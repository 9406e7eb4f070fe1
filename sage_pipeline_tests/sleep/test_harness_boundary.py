"""No production module imports the test harness (``sage_pipeline.sleep.harness``): every module under
``sage_pipeline/`` but the harness itself is parsed and its imports (top level and inside functions) checked."""

from __future__ import annotations

import ast
from pathlib import Path

import sage_pipeline

PKG = Path(sage_pipeline.__file__).resolve().parent
HARNESS = "sage_pipeline.sleep.harness"


def _imports(path: Path) -> list[tuple[int, str]]:
    mod = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                pkg = mod.split(".")[: -node.level] if not path.name == "__init__.py" else mod.split(".")[
                    : len(mod.split(".")) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            out += [(node.lineno, f"{base}.{a.name}" if base else a.name) for a in node.names] + [(node.lineno, base)]
    return out


def harness_imports(root: Path = PKG) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(PKG.parent)
        if rel.parts[:3] == ("sage_pipeline", "sleep", "harness"):
            continue
        for line, name in _imports(path):
            if name == HARNESS or name.startswith(HARNESS + "."):
                bad.append(f"{rel}:{line} imports {name}")
    return bad


def test_no_production_module_imports_the_harness():
    assert harness_imports() == [], "production code imports the test harness:\n" + "\n".join(harness_imports())


def test_the_scan_finds_an_import_of_the_harness(tmp_path):
    pkg = tmp_path / "sage_pipeline"
    (pkg / "x").mkdir(parents=True)
    (pkg / "x" / "bad.py").write_text("def f():\n    from sage_pipeline.sleep.harness.standin import StandinModel\n")
    (pkg / "x" / "rel.py").write_text("from ..sleep.harness import standin\n")
    (pkg / "x" / "ok.py").write_text("import sage_pipeline.sleep.sage_night\n")
    global PKG
    saved, PKG = PKG, pkg
    try:
        found = harness_imports(pkg)
    finally:
        PKG = saved
    assert found == ["sage_pipeline/x/bad.py:2 imports sage_pipeline.sleep.harness.standin.StandinModel",
                     "sage_pipeline/x/bad.py:2 imports sage_pipeline.sleep.harness.standin",
                     "sage_pipeline/x/rel.py:1 imports sage_pipeline.sleep.harness.standin",
                     "sage_pipeline/x/rel.py:1 imports sage_pipeline.sleep.harness"]
