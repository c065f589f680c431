"""ZeRO-3 ranks about to gather different modules stop within seconds with the modules named, on every rank; ranks
that agree are never stopped (every other multi-process ZeRO-3 test runs with the check on, as users get it)."""

import json

import pytest

from conftest import REPO, run_worker

pytestmark = pytest.mark.multiproc
WORKER = REPO / "tests" / "workers" / "diverge.py"


def _run(tmp_path, *flags, expect_fail=False):
    return run_worker(["--out", tmp_path / "run", *flags], nproc=2, script=WORKER, expect_fail=expect_fail, timeout=300)


def _stops(proc):
    return [line for line in proc.stdout.splitlines() if " diverged after " in line]


def test_a_branch_on_one_rank_stops_every_rank_naming_both_modules(tmp_path):
    proc = _run(tmp_path, "--diverge-at", "0", expect_fail=True)
    stops = _stops(proc)
    assert sorted(line.split(" diverged")[0] for line in stops) == ["rank 0", "rank 1"]
    message = stops[0].split(": ", 1)[1]
    assert all(line.split(": ", 1)[1] == message for line in stops)  # one message, the same on every rank
    assert "diverged at step 0, micro-step 0" in message
    assert "rank 0: 'rank_zero_only'; rank 1: 'shared'" in message and "Fix:" in message
    assert all(float(line.split(" after ")[1].split(" s")[0]) < 60 for line in stops)  # engine start included
    assert "collective mismatch" not in proc.stderr  # stopped before gloo saw the gathers differ


def test_the_accelerate_door_stops_a_branch_on_one_rank_too(tmp_path):
    # hf_zero.prepare in Accelerate's own loop: the same check, the same message
    proc = _run(tmp_path, "--diverge-at", "0", "--door", "loop", expect_fail=True)
    stops = _stops(proc)
    assert sorted(line.split(" diverged")[0] for line in stops) == ["rank 0", "rank 1"]
    assert "rank 0: 'rank_zero_only'; rank 1: 'shared'" in stops[0] and "Fix:" in stops[0]


@pytest.mark.slow  # the quiet side of the Accelerate door (the Trainer door's is in make test)
def test_the_accelerate_door_lets_agreeing_ranks_train(tmp_path):
    quiet = _run(tmp_path, "--door", "loop", "--steps", "3")
    assert not _stops(quiet) and '"steps": 3' in quiet.stdout


def test_always_catches_a_divergence_after_the_first_steps(tmp_path):
    proc = _run(tmp_path, "--diverge-at", "3", "--check", "always", expect_fail=True)
    assert len(_stops(proc)) == 2 and "diverged at step 3, micro-step 0" in _stops(proc)[0]


def test_quiet_when_ranks_agree_and_gone_after_the_first_steps(tmp_path):
    proc = _run(tmp_path)
    watches = [json.loads(line.split("WATCH ", 1)[1]) for line in proc.stdout.splitlines() if "WATCH " in line]
    # two forwards checked (start, embed, shared, head, end), then the hooks removed: steps 3 and 4 pay nothing
    assert sorted(w["rank"] for w in watches) == [0, 1]
    assert all(w["checks"] == 10 and w["hooks_left"] == 0 for w in watches)
    assert not _stops(proc)
