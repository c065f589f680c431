"""ZeRO-3 with the optimizer offloaded and the 16-bit parameters on the GPU: ZeroCallback copies each host-stepped
sub-group's update to the GPU through a pinned buffer (hf_zero/engine/fixes.py), with the same bits DeepSpeed's
own copy writes, and only where DeepSpeed's ZeRO-3 optimizer would copy from pageable memory."""

import pytest
import torch

from conftest import REPO, differing_tensors, read_result, run_worker

WORKER = REPO / "tests" / "workers" / "offload_overflow.py"


def _stage3_optimizer(*, half_device="meta", pin_memory=True, cls=None, zenflow=False):
    """DeepSpeed's ZeRO-3 optimizer class with only what the fix reads: two sub-groups, fp32 masters in host memory,
    16-bit partitions on ``half_device`` ("meta" stands for the GPU, which this machine lacks)."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    optimizer = (cls or DeepSpeedZeroOptimizer_Stage3).__new__(cls or DeepSpeedZeroOptimizer_Stage3)
    optimizer.offload_optimizer, optimizer.offload_optimizer_pin_memory = True, pin_memory
    optimizer.zenflow, optimizer.swap_optimizer = zenflow, False
    optimizer.fp16_partitioned_groups_flat = [torch.empty(6, dtype=torch.bfloat16, device=half_device) for _ in "ab"]
    optimizer.fp32_partitioned_groups_flat = [torch.zeros(6) for _ in "ab"]
    return optimizer


def _fix(optimizer, version="0.19.8", available_bytes=2**30):
    from types import SimpleNamespace

    from hf_zero.engine.fixes import zero3_updates_copied_through_pinned_memory

    return zero3_updates_copied_through_pinned_memory(SimpleNamespace(optimizer=optimizer), version=version,
                                                      available_bytes=available_bytes)


def _replaced(optimizer) -> bool:
    return "_reassign_or_swap_out_partitioned_parameters" in vars(optimizer)


def test_applied_where_the_16_bit_partitions_are_on_the_accelerator():
    optimizer = _stage3_optimizer()
    note = _fix(optimizer)
    assert note and "2 sub-group(s)" in note and _replaced(optimizer)


def test_left_alone_when_the_host_lacks_room_for_the_buffers():
    # two sub-groups of six bf16 elements: 24 bytes of buffers, applied only with twice that available
    optimizer = _stage3_optimizer()
    assert _fix(optimizer, available_bytes=47) is None and not _replaced(optimizer)
    assert _fix(optimizer, available_bytes=48) is not None and _replaced(optimizer)


@pytest.mark.parametrize("case", ["parameters offloaded too", "pin_memory false", "zenflow", "superoffload",
                                  "release 0.19.7", "release 0.20.0"])
def test_left_alone(case):
    from deepspeed.runtime.superoffload.superoffload_stage3 import SuperOffloadOptimizer_Stage3

    optimizer = _stage3_optimizer(half_device="cpu" if case == "parameters offloaded too" else "meta",
                                  pin_memory=case != "pin_memory false", zenflow=case == "zenflow",
                                  cls=SuperOffloadOptimizer_Stage3 if case == "superoffload" else None)
    assert _fix(optimizer, version=case.removeprefix("release ") if case.startswith("release") else "0.19.8") is None
    assert not _replaced(optimizer)


def test_left_alone_under_zero_1_and_2():
    from types import SimpleNamespace

    from hf_zero.engine.fixes import zero3_updates_copied_through_pinned_memory

    optimizer = SimpleNamespace(cpu_offload=True, compute_grad_norm=True)
    assert zero3_updates_copied_through_pinned_memory(SimpleNamespace(optimizer=optimizer), version="0.19.8") is None


def test_the_copy_rounds_as_deepspeed_does_and_keeps_other_sub_groups_on_its_path():
    from types import SimpleNamespace

    from hf_zero.engine.fixes import copy_updates_through_pinned_memory

    calls = []
    master = torch.tensor([1.0 + 2 ** -9, -3.3, 1e-8, 65504.0, 0.1, 7.0])  # values bf16 must round
    optimizer = SimpleNamespace(
        fp16_partitioned_groups_flat=[torch.zeros(6, dtype=torch.bfloat16) for _ in "ab"],
        fp32_partitioned_groups_flat=[torch.zeros(6), master],
        _reassign_or_swap_out_partitioned_parameters=lambda i: calls.append(("deepspeed", i)),
        _unflatten_partitioned_parameters=lambda i: calls.append(("unflatten", i)))
    copy_updates_through_pinned_memory(optimizer, [1])
    optimizer._reassign_or_swap_out_partitioned_parameters(0)
    optimizer._reassign_or_swap_out_partitioned_parameters(1)
    assert torch.equal(optimizer.fp16_partitioned_groups_flat[1], master.to(torch.bfloat16))
    assert calls == [("deepspeed", 0), ("unflatten", 1)]
    master.add_(1.0)  # the next step: the same buffer again
    optimizer._reassign_or_swap_out_partitioned_parameters(1)
    assert torch.equal(optimizer.fp16_partitioned_groups_flat[1], master.to(torch.bfloat16))


@pytest.fixture(scope="module")
def zero3_runs(tiny_models, tmp_path_factory):
    """zero3_offload without offload_param (bf16, 2 micro-batches a step): as shipped, and with the pinned copy."""
    cache = {}

    def run(*flags):
        if flags not in cache:
            out = tmp_path_factory.mktemp("pinned-copy")
            run_worker(["--model", tiny_models["llama"], "--out", out, "--bf16", "--preset", "zero3_offload",
                        "--params-on-gpu", *flags], script=WORKER, timeout=600)
            cache[flags] = out
        return cache[flags]

    return run


@pytest.mark.slow  # two real ZeRO-3 offload trainings with the CPU Adam, about 1.5 min
@pytest.mark.multiproc
def test_a_real_zero3_engine_trains_the_same_bits_through_the_pinned_copy(zero3_runs):
    shipped, pinned = read_result(zero3_runs()), read_result(zero3_runs("--pinned-copy"))
    # exact on any CPU: the runs differ only in how the updated partitions are copied, and a copy changes no bit
    # without a GPU the 16-bit partitions are in host memory: the fix itself stays out of a real engine
    assert not shipped["pinned_copy"]
    assert pinned["pinned_copy"] and pinned["pinned_sub_groups"]
    assert pinned["losses"] == shipped["losses"] and len(pinned["losses"]) == 3
    assert differing_tensors(zero3_runs() / "weights.safetensors",
                             zero3_runs("--pinned-copy") / "weights.safetensors") == {}
