"""ZeRO-3 ranks about to gather different modules stop within seconds with the modules named, on every rank; ranks
that agree are never stopped (every other multi-process ZeRO-3 test runs with the check on, as users get it)."""

import json
import signal
import subprocess

import pytest

from conftest import REPO, launch_command, run_worker, worker_env

pytestmark = pytest.mark.multiproc
WORKER = REPO / "tests" / "workers" / "diverge.py"


# Plain DeepSpeed (divergence_check="off") stops both cases below in 7-9 s from launch on 2 CPU processes (gloo's
# "collective mismatch" abort); hf_zero may take a few seconds more to name the modules, never minutes
PLAIN_S = 9
BOUND_S = PLAIN_S + 15


def _run(tmp_path, *flags, expect_fail=False, timeout=300):
    return run_worker(["--out", tmp_path / "run", *flags], nproc=2, script=WORKER, expect_fail=expect_fail,
                      timeout=timeout)


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


@pytest.mark.slow  # make test keeps the Trainer door's branch test; this door runs in make test-long
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


@pytest.mark.slow  # the 'always' mode; the default mode's catch of a late divergence is in make test
def test_always_catches_a_divergence_after_the_first_steps(tmp_path):
    proc = _run(tmp_path, "--diverge-at", "3", "--check", "always", expect_fail=True)
    assert len(_stops(proc)) == 2 and "diverged at step 3, micro-step 0" in _stops(proc)[0]


def _stopped_within_seconds(tmp_path, *flags):
    """The run with ``flags``, which must stop (bounded: a wait of minutes fails the test); the lines that say why,
    each rank's log of the verdict included."""
    cmd = launch_command("torchrun", 2, [str(a) for a in ["--out", tmp_path / "run", *flags]], WORKER)
    launched = subprocess.Popen(cmd, cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        out, err = launched.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        launched.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers (each in its own session)
        out, err = launched.communicate(timeout=60)
        pytest.fail(f"still running after {BOUND_S} s (plain DeepSpeed stops in {PLAIN_S} s):\n{out[-3000:]}\n"
                    f"--- stderr ---\n{err[-3000:]}")
    proc = subprocess.CompletedProcess(cmd, launched.returncode, out, err)
    assert proc.returncode != 0, out[-3000:]
    stops = _stops(proc)
    assert stops, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all(float(line.split(" after ")[1].split(" s")[0]) < BOUND_S - 5 for line in stops)
    heard = [line for line in proc.stderr.splitlines() if line.startswith("hf_zero: rank ") and " stops: " in line]
    return [line.split(": ", 1)[1] for line in stops] + [line.split(" stops: ", 1)[1] for line in heard], proc


def test_a_parameter_read_on_one_rank_stops_within_seconds_naming_it(tmp_path):
    # rank 0's forward reads a weight directly (no module call): DeepSpeed gathers it in a collective rank 1 never
    # joins, while rank 1 waits at the check before 'shared'
    messages, proc = _stopped_within_seconds(tmp_path, "--diverge-at", "0", "--case", "read-param")
    message = messages[0]
    assert "rank 0: inside DeepSpeed's gather of parameter 'rank_zero_only.weight'" in message
    assert "diverge.py:" in message  # the user's line that read it
    assert "rank 1: 'shared'" in message and "Fix:" in message
    assert "rank 0 stops: " in proc.stderr and "rank 1 stops: " in proc.stderr  # each rank's log names both


def test_a_generate_on_one_rank_stops_within_seconds_naming_both_sides(tmp_path):
    # rank 0 runs a generate-like loop of forwards at step 1; rank 1 goes on into its backward
    messages, proc = _stopped_within_seconds(tmp_path, "--diverge-at", "1", "--case", "generate")
    message = messages[0]
    assert "diverged at step 1, micro-step 0" in message
    assert "rank 0: the start of a forward" in message
    assert "rank 1: inside DeepSpeed's gather of 'head' in backward" in message


def test_a_divergence_after_the_first_steps_is_caught_by_default(tmp_path):
    messages, _ = _stopped_within_seconds(tmp_path, "--diverge-at", "3", "--case", "generate")
    assert "diverged at step 3, micro-step 0" in messages[0] and "rank 0: the start of a forward" in messages[0]


def test_quiet_by_default_checking_every_module_then_each_forward(tmp_path):
    proc = _run(tmp_path)
    watches = [json.loads(line.split("WATCH ", 1)[1]) for line in proc.stdout.splitlines() if "WATCH " in line]
    # steps 0-1: every check (start, embed, shared, head, end); steps 2-3: one exchange at each forward's start and end
    assert sorted(w["rank"] for w in watches) == [0, 1]
    assert all(w["checks"] == 10 and w["fingerprints"] == 4 for w in watches)
    assert not _stops(proc)


def test_quiet_when_ranks_agree_and_gone_after_the_first_steps(tmp_path):
    proc = _run(tmp_path, "--check", "first_steps")
    watches = [json.loads(line.split("WATCH ", 1)[1]) for line in proc.stdout.splitlines() if "WATCH " in line]
    # two forwards checked (start, embed, shared, head, end), then the hooks removed: steps 3 and 4 pay nothing
    assert sorted(w["rank"] for w in watches) == [0, 1]
    assert all(w["checks"] == 10 and w["hooks_left"] == 0 for w in watches)
    assert not _stops(proc)
