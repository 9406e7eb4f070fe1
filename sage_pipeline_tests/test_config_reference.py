"""docs/configuration.md is generated from the pydantic models (scripts/config_reference.py, make
config-docs): the file must be what the generator writes from ``sage_pipeline.definitions`` now, and
the generator must see every change a user would: a field's description, default, bound, type or a
new field, in a nested section too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Literal

import dagster as dg
import pytest
from pydantic import BaseModel, Field, model_validator

from sage_pipeline.definitions import defs

REPO = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module's annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()


def test_docs_configuration_md_is_what_the_generator_writes():
    want = gen.render(defs)
    have = gen.OUT.read_text(encoding="utf-8") if gen.OUT.exists() else ""
    if have != want:
        import difflib

        diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), "docs/configuration.md",
                                                 "generated", n=1))[:60])
        pytest.fail(f"{gen.STALE}\n{diff}")


def test_the_reference_covers_every_config_of_the_definitions():
    found, bare = gen.entries(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    listed = {a for e in found for a, _, _ in e.assets} | {a for a, _, _ in bare}
    assert listed == keys
    assert {e.resource_key for e in found if e.resource_key} == set(defs.resources)
    text = gen.render(defs)
    for e in found:  # every field of every config, nested sections included, has its row
        rows, _ = gen.rows(e.cls, e.instance)
        assert rows, e.cls
        for r in rows:
            assert f"| `{r.path}` | {r.type} |" in text
    assert "/work/" not in text and str(REPO) not in text  # paths inside the package are relative to it


# ------------------------------------------------------------------ the generator sees a change
class _Inner(BaseModel):
    depth: int = Field(3, ge=1, le=9, description="levels of the inner thing")


def _defs_with(config_cls: type[dg.Config]) -> dg.Definitions:
    def probe(config) -> None:
        ...

    # the annotation as an object: under `from __future__ import annotations` a local class's name would not resolve
    probe.__annotations__ = {"config": config_cls, "return": None}
    probe = dg.asset(group_name="g", description="an asset whose run config is the class under test")(probe)

    @dg.asset(group_name="g", description="an asset with no run config")
    def plain() -> None:
        ...

    return dg.Definitions(assets=[probe, plain])


def _config(description: str = "how many things", default: int = 5, le: int = 10,
            kind: tuple = ("a", "b"), extra: bool = False, depth_default: int = 3) -> type[dg.Config]:
    class InnerSection(dg.Config, _Inner):
        pass

    annotations = {"count": int, "kind": Literal[kind], "inner": InnerSection}
    body = {
        "__doc__": "The probe's run config.",
        "__module__": __name__,
        "count": Field(default, ge=0, le=le, description=description),
        "kind": Field(kind[0], description="which kind"),
        "inner": Field(default_factory=lambda: InnerSection(depth=depth_default), description="the inner section"),
    }
    if extra:
        annotations["added"] = bool
        body["added"] = Field(False, description="a new switch")
    body["__annotations__"] = annotations
    return type("ProbeConfig", (dg.Config,), body)


def test_render_lists_the_asset_field_type_default_constraints_and_description():
    text = gen.render(_defs_with(_config()))
    assert "### ProbeConfig" in text and "Used by `probe` (run config: `ops.probe.config`)" in text
    assert "| `count` | `int` | `5` | ≥ 0; ≤ 10 | how many things |" in text
    assert "| `kind` | `'a' \\| 'b'` | `\"a\"` |  | which kind |" in text
    assert "| `inner` | `InnerSection` | (section) |  | the inner section |" in text
    assert "| `inner.depth` | `int` | `3` | ≥ 1; ≤ 9 | levels of the inner thing |" in text
    assert "| `plain` | g | `plain` | none |" in text
    assert gen.render(_defs_with(_config())) == text  # deterministic


@pytest.mark.parametrize("change", [
    {"description": "how many things, at most"},
    {"default": 6},
    {"le": 11},
    {"kind": ("a", "b", "c")},
    {"extra": True},
    {"depth_default": 4},  # a nested section's default, made by its parent's factory
])
def test_the_generator_notices_a_changed_field(change, tmp_path):
    before = gen.render(_defs_with(_config()))
    after = gen.render(_defs_with(_config(**change)))
    assert after != before
    page = tmp_path / "configuration.md"
    page.write_text(before, encoding="utf-8")
    assert gen.stale(page, _defs_with(_config())) is None
    assert gen.stale(page, _defs_with(_config(**change))) == gen.STALE
    assert gen.stale(tmp_path / "missing.md", _defs_with(_config())).startswith(gen.STALE)


def test_a_model_validator_is_listed_as_a_check_across_fields():
    class Checked(dg.Config):
        low: int = Field(0, description="the low end")
        high: int = Field(1, description="the high end")

        @model_validator(mode="after")
        def _ordered(self):
            """low stays below high."""
            if self.low >= self.high:
                raise ValueError("low must be below high")
            return self

    text = gen.render(_defs_with(Checked))
    assert "- `(the whole config)`: `test_a_model_validator_is_listed_as_a_check_across_fields.<locals>." \
           "Checked._ordered`: low stays below high." in text


def test_an_untyped_config_schema_is_refused_naming_the_asset():
    @dg.asset(config_schema={"n": int}, description="an old-style config")
    def old_style(context) -> None:
        ...

    with pytest.raises(gen.ConfigReferenceError, match=r"asset old_style .*test_config_reference.py:\d+.*dg.Config"):
        gen.render(dg.Definitions(assets=[old_style]))


def test_check_mode_exits_1_on_a_stale_file_and_0_on_a_fresh_one(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    page.write_text("# an old reference\n", encoding="utf-8")
    assert gen.main(["--check", "--out", str(page)]) == 1
    assert gen.STALE in capsys.readouterr().err
    assert page.read_text(encoding="utf-8") == "# an old reference\n"  # --check writes nothing
    assert gen.main(["--out", str(page)]) == 0
    assert gen.main(["--check", "--out", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == gen.render(defs)
