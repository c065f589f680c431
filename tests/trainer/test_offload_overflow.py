"""ZeroCallback leaves out DeepSpeed's per-parameter host test for inf/NaN gradients under ZeRO offload
(hf_zero/engine/fixes.py): the same bits trained, the same overflow steps skipped, and only where it applies."""

import pytest

from conftest import REPO, read_result, run_worker

WORKER = REPO / "tests" / "workers" / "offload_overflow.py"


@pytest.fixture(scope="module")
def runs(tiny_models, tmp_path_factory):
    """zero2_offload runs (bf16, 2 micro-batches a step), with the fix and as DeepSpeed ships, one with a NaN step."""
    cache = {}

    def run(*flags):
        if flags not in cache:
            out = tmp_path_factory.mktemp("offload-overflow")
            run_worker(["--model", tiny_models["llama"], "--out", out, "--bf16", *flags], script=WORKER, timeout=600)
            cache[flags] = out
        return cache[flags]

    return run


def _weights(out):
    from safetensors.torch import load_file

    return load_file(str(out / "weights.safetensors"))


def _same_weights(a, b):
    import torch

    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow  # real zero2_offload runs: the CPU Adam build and five short trainings, about 2.5 min
@pytest.mark.multiproc
def test_fix_applied_under_offload_and_trains_the_same_bits(runs):
    fixed, shipped = runs(), runs("--keep-syncs")
    # exact on any CPU: the runs differ only in a test that reads the gradients (DeepSpeed's per-parameter inf/NaN
    # check), not in any arithmetic
    assert read_result(fixed)["fixed"] and not read_result(shipped)["fixed"]
    assert read_result(fixed)["losses"] == read_result(shipped)["losses"]
    assert _same_weights(fixed, shipped)


@pytest.mark.slow  # real zero2_offload runs: the CPU Adam build and five short trainings, about 2.5 min
@pytest.mark.multiproc
def test_an_overflow_step_is_skipped_as_deepspeed_skips_it(runs):
    # step 2's gradients are all NaN: the update is skipped, so 2 steps end where 1 step ends
    fixed, shipped = runs("--steps", "2", "--nan-step", "2"), runs("--steps", "2", "--nan-step", "2", "--keep-syncs")
    assert read_result(fixed)["fixed"]
    assert _same_weights(fixed, runs("--steps", "1"))
    assert _same_weights(shipped, runs("--steps", "1"))


def test_quiet_without_offload():
    from types import SimpleNamespace

    from hf_zero.engine.fixes import offload_overflow_syncs_removed

    def tracker(grad):
        return None

    optimizer = SimpleNamespace(cpu_offload=False, compute_grad_norm=True, update_offload_overflow_tracker=tracker)
    assert offload_overflow_syncs_removed(SimpleNamespace(optimizer=optimizer)) is None
    assert optimizer.update_offload_overflow_tracker is tracker


def test_quiet_outside_the_releases_it_was_checked_on():
    from types import SimpleNamespace

    from hf_zero.engine.fixes import offload_overflow_syncs_removed

    def tracker(grad):
        return None

    optimizer = SimpleNamespace(cpu_offload=True, compute_grad_norm=True, zenflow=False,
                                update_offload_overflow_tracker=tracker)
    engine = SimpleNamespace(optimizer=optimizer)
    assert offload_overflow_syncs_removed(engine, version="0.20.0") is None
    assert offload_overflow_syncs_removed(engine, version="0.19.7") is None
    assert optimizer.update_offload_overflow_tracker is tracker
    assert offload_overflow_syncs_removed(engine, version="0.19.8") is not None
    assert optimizer.update_offload_overflow_tracker is not tracker


@pytest.mark.slow  # real zero2_offload runs: the CPU Adam build and five short trainings, about 2.5 min
@pytest.mark.multiproc
def test_offload_threads_raised_to_the_process_share_of_the_cores(runs):
    # the test workers run with OMP_NUM_THREADS=1, as accelerate launch leaves a GPU machine's processes
    import os

    result = read_result(runs())
    cores = len(os.sched_getaffinity(0))
    assert result["threads"] == cores
    if cores > 1:
        assert any("DeepSpeed's CPU Adam would run on 1 core(s)" in w for w in result["warnings"])


OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


@pytest.mark.parametrize("config, wanted, have", [
    ({"zero_optimization": {"stage": 2}}, "auto", 1),  # no optimizer on the host
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}, "auto", 1),  # parameters only
    ({"zero_optimization": {**OFFLOAD["zero_optimization"], "zenflow": {"topk_ratio": 0.05}}}, "auto", 1),  # ZenFlow
    (OFFLOAD, "auto", 4),  # already its share
    (OFFLOAD, None, 1),  # the user's choice: leave it
    (OFFLOAD, 0, 1),
])
def test_quiet_offload_threads(config, wanted, have):
    import torch

    from hf_zero.engine.offload_threads import threads_for_offload

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(have)
        assert threads_for_offload(config, wanted, cores=8, local=2) is None
        assert torch.get_num_threads() == have
    finally:
        torch.set_num_threads(before)


def test_offload_threads_fire_with_one_thread_of_eight_cores():
    import torch

    from hf_zero.engine.offload_threads import threads_for_offload

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        note = threads_for_offload(OFFLOAD, cores=8, local=2)
        assert "raised to 4" in note and torch.get_num_threads() == 4
        torch.set_num_threads(1)
        assert "raised to 3" in threads_for_offload(OFFLOAD, 3, cores=8, local=2)
    finally:
        torch.set_num_threads(before)
