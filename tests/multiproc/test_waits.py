"""hf_zero's own waits have a limit: a rank that never arrives stops the others with its number, in seconds."""

import time

import pytest

from conftest import REPO, run_worker

pytestmark = pytest.mark.multiproc
WORKER = REPO / "tests" / "workers" / "wait_for_ranks.py"


def test_shutdown_names_the_rank_that_never_arrives():
    started = time.monotonic()
    proc = run_worker(["--away", "60", "--limit", "3"], nproc=2, script=WORKER, expect_fail=True, timeout=120)
    assert time.monotonic() - started < 50  # rank 0 gave up and the launcher stopped rank 1, long before it came
    assert "rank 0 gave up after" in proc.stdout
    assert "hf_zero.shutdown() waits for every rank, but not all of them arrived within 3 s" in proc.stdout
    assert "(rank 1 did not)" in proc.stdout and "Fix: every rank must reach it" in proc.stdout


def test_shutdown_quiet_when_every_rank_arrives_in_time():
    # rank 1 comes a second late: inside the limit, nothing to report
    proc = run_worker(["--away", "1", "--limit", "10"], nproc=2, script=WORKER)
    assert proc.stdout.count("hf_zero-test: worker finished") == 2 and "gave up" not in proc.stdout
