"""The first run that builds DeepSpeed's ops says so, and the builds are cached with the Python environment."""

import sys

import pytest

from hf_zero.compat import op_builds


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A pip-installed environment at tmp_path (sys.prefix) whose shell never set TORCH_EXTENSIONS_DIR."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(op_builds, "_told", False)
    return tmp_path


def test_first_build_is_announced_once_with_the_cache_folder(fresh, capsys, monkeypatch):
    op_builds.prepare_op_builds()
    op_builds.prepare_op_builds()
    err = capsys.readouterr().err
    cache = fresh / "torch_extensions"
    assert __import__("os").environ["TORCH_EXTENSIONS_DIR"] == str(cache)
    assert err.count("\n") == 1 and "can take minutes" in err and str(cache) in err, err


def test_quiet_once_an_op_is_built(fresh, capsys):
    built = fresh / "torch_extensions" / "shm_comm"
    built.mkdir(parents=True)
    (built / "shm_comm.so").write_bytes(b"")
    op_builds.prepare_op_builds()
    assert capsys.readouterr().err == ""


def test_a_users_folder_is_kept_and_other_ranks_stay_quiet(fresh, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    op_builds.prepare_op_builds()
    assert __import__("os").environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")
    assert capsys.readouterr().err == ""
