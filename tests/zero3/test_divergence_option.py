"""The divergence check's option, and the runs where it has nothing to compare (the two-rank runs are in
tests/multiproc/test_divergence.py)."""

import pytest

import hf_zero
from hf_zero.zero3.divergence import divergence_check_problem, watch_fetch_order


def test_option_values():
    assert divergence_check_problem("first_steps") is None and divergence_check_problem("off") is None
    assert divergence_check_problem("always") is None and divergence_check_problem("whole_run") is None
    assert "must be one of" in divergence_check_problem("sometimes")
    with pytest.raises(hf_zero.ConfigError, match="divergence_check must be one of"):
        hf_zero.ZeroCallback(divergence_check=True)


def test_nothing_runs_without_other_ranks():
    assert watch_fetch_order(object(), "always") is None  # no process group: nothing to compare
