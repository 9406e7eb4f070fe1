"""SAGE_DATA_DIR set but empty is refused, naming the variable (issue 35), never the current folder."""

from __future__ import annotations

import pytest

from sage_pipeline import artifacts


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_sage_data_dir_is_refused_naming_the_variable(monkeypatch, tmp_path, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SAGE_DATA_DIR", value)
    with pytest.raises(ValueError, match=r"^SAGE_DATA_DIR is set but empty .*: set it to the artifact folder, "
                                         r"or unset it to use \./datasets$"):
        artifacts.data_dir()
    assert not any(tmp_path.iterdir())


def test_unset_sage_data_dir_is_datasets_and_an_override_wins(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SAGE_DATA_DIR", raising=False)
    assert artifacts.data_dir() == tmp_path / "datasets"
    monkeypatch.setenv("SAGE_DATA_DIR", "")
    assert artifacts.data_dir(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    monkeypatch.setenv("SAGE_DATA_DIR", str(tmp_path / "root"))
    assert artifacts.data_dir() == tmp_path / "root"
