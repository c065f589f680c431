"""ZeRO-1/2 with the optimizer offloaded: ZeroCallback runs the host's part of each optimizer step in chunks
(hf_zero/engine/fixes.py), with the same bits as DeepSpeed's one pass, and only on DeepSpeed's own ZeRO-1/2 optimizer
stepping DeepSpeedCPUAdam over pinned fp32 partitions whose 16-bit partitions are on an accelerator."""

import pytest
import torch

from conftest import REPO, differing_tensors, read_result, run_worker

WORKER = REPO / "tests" / "workers" / "offload_overflow.py"


@pytest.fixture(scope="module")
def zero2_runs(tiny_models, tmp_path_factory):
    """zero2_offload (2 micro-batches a step, 4 steps): as shipped, and with the chunked step forced on."""
    cache = {}

    def run(*flags):
        if flags not in cache:
            out = tmp_path_factory.mktemp("chunked-step")
            model = tiny_models[flags[flags.index("--model") + 1]] if "--model" in flags else tiny_models["llama"]
            flags_without_model = [f for i, f in enumerate(flags) if "--model" not in flags[max(i - 1, 0):i + 1]]
            run_worker(["--model", model, "--out", out, "--steps", "4", *flags_without_model], script=WORKER,
                       timeout=600)
            cache[flags] = out
        return cache[flags]

    return run


@pytest.mark.slow  # real ZeRO-2 offload trainings with the CPU Adam, about 30 s each
@pytest.mark.multiproc
@pytest.mark.parametrize("flags", [("--bf16",), ("--bf16", "--max-grad-norm", "0"), (),
                                   ("--bf16", "--in-forward"), ("--bf16", "--in-forward", "--model", "gpt2")],
                         ids=["bf16 clipped", "bf16 unclipped", "fp32 clipped", "in the next forward",
                              "in the next forward, tied embeddings"])
def test_a_real_zero2_engine_trains_the_same_bits_in_chunks(zero2_runs, flags):
    # chunks of 4,096 elements: the tiny Llama's partition (about 74k elements) in many chunks, the last one partial.
    # Exact on any CPU: the same CPU Adam updates the same elements from the same gradients, and 4,096 is a multiple of
    # its vector tile (AVX2 or AVX-512), so each element takes the same vector or scalar path in both runs
    base = tuple(f for f in flags if f != "--in-forward")
    shipped, chunked = zero2_runs(*base), zero2_runs(*flags, "--chunked-step", "4096")
    a, b = read_result(shipped), read_result(chunked)
    assert not a["chunked_step"] and b["chunked_step"] and b["in_forward"] == ("--in-forward" in flags)
    assert len(a["losses"]) == 4 and a["losses"] == b["losses"] and a["grad_norms"] == b["grad_norms"]
    assert differing_tensors(shipped / "weights.safetensors", chunked / "weights.safetensors") == {}


def _stage2_optimizer(*, half_device="meta", pin_memory=True, zenflow=False, adam=None, cls=None, ranks=1):
    # adam: an optimizer class to build over the master (DeepSpeedCPUAdam, uninitialized, by default)
    """DeepSpeed's ZeRO-1/2 optimizer class with only what the gate reads: one parameter group, its fp32 partition in
    host memory, its 16-bit partition on ``half_device`` ("meta" stands for the GPU, which this machine lacks)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    cls = cls or DeepSpeedZeroOptimizer
    optimizer = cls.__new__(cls)
    optimizer.cpu_offload, optimizer.cpu_offload_pin_memory = True, pin_memory
    optimizer.zenflow, optimizer.torch_autocast_gradscaler = zenflow, None
    master = torch.nn.Parameter(torch.zeros(8))
    optimizer.single_partition_of_fp32_groups = [master]
    optimizer.parallel_partitioned_bit16_groups = [[torch.empty(8, dtype=torch.bfloat16, device=half_device)]]
    optimizer.param_buffer_of_bit16_for_cpu_offload_groups = [torch.empty(8, dtype=torch.bfloat16)]
    if adam is None:  # the class without its C++ op, whose first build takes most of a minute
        adam = DeepSpeedCPUAdam.__new__(DeepSpeedCPUAdam)
        adam.param_groups = [{"params": [master]}]
    else:
        adam = adam([master], lr=1e-3)
    optimizer.optimizer = adam
    optimizer.reset_cpu_buffers = lambda: None
    optimizer.partition_count = [ranks]
    optimizer.bit16_groups = [[]]
    optimizer.bit16_groups_flat = [torch.empty(8, dtype=torch.bfloat16)]
    return optimizer


def _fix(optimizer, version="0.19.8"):
    from types import SimpleNamespace

    from hf_zero.engine.fixes import zero2_offload_step_in_next_forward

    module = torch.nn.Linear(2, 2)
    return zero2_offload_step_in_next_forward(SimpleNamespace(optimizer=optimizer, module=module), version=version)


def _replaced(optimizer) -> bool:
    return "_optimizer_step" in vars(optimizer) and "unscale_and_clip_grads" in vars(optimizer)


def test_applied_where_the_16_bit_partitions_are_on_the_accelerator():
    optimizer = _stage2_optimizer()
    assert "chunks of 4,194,304 elements" in _fix(optimizer) and _replaced(optimizer)
    assert optimizer.hf_zero_step_in_forward is not None


@pytest.mark.parametrize("case", ["16-bit partitions in host memory", "pin_memory false", "zenflow", "torch adam",
                                  "a subclass's own step", "two ranks", "release 0.19.7", "release 0.20.0"])
def test_left_alone(case):
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    class OwnStep(DeepSpeedZeroOptimizer):
        def step(self, closure=None):
            return None

    optimizer = _stage2_optimizer(half_device="cpu" if case.startswith("16-bit") else "meta",
                                  pin_memory=case != "pin_memory false", zenflow=case == "zenflow",
                                  adam=torch.optim.AdamW if case == "torch adam" else None,
                                  cls=OwnStep if case == "a subclass's own step" else None,
                                  ranks=2 if case == "two ranks" else 1)
    assert _fix(optimizer, version=case.removeprefix("release ") if case.startswith("release") else "0.19.8") is None
    assert not _replaced(optimizer)


def test_left_alone_under_zero_3():
    from types import SimpleNamespace

    optimizer = SimpleNamespace(offload_optimizer=True, fp16_partitioned_groups_flat=[])
    assert _fix(optimizer) is None


@pytest.mark.parametrize("chunk, fires", [(None, False), (4096, False), (1 << 22, False), (0, True), (4095, True),
                                          (-4096, True), (True, True), ("big", True)])
def test_the_chunk_option(chunk, fires):
    from hf_zero import ZeroCallback
    from hf_zero.errors import ConfigError

    if fires:
        with pytest.raises(ConfigError, match="multiple of 4,096"):
            ZeroCallback(offload_step_chunk=chunk)
    else:
        assert ZeroCallback(offload_step_chunk=chunk).options["offload_step_chunk"] == chunk


class _Flat:
    """What StepFinishedInForward reads of a ZeRO-1/2 optimizer, over a real model: its parameters as views of one
    flat 16-bit buffer (as DeepSpeed lays them out), a fp32 master copy with a gradient, and DeepSpeedCPUAdam after
    a first step (the moments exist)."""

    def __init__(self, model):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        params = list(model.parameters())
        self.flat = torch.cat([p.detach().reshape(-1) for p in params]).to(torch.bfloat16)
        start = 0
        for p in params:
            p.data = self.flat[start:start + p.numel()].view_as(p)
            start += p.numel()
        self.bit16_groups, self.bit16_groups_flat = [params], [self.flat]
        self.master = torch.nn.Parameter(self.flat.float())
        self.master.grad = torch.linspace(-1, 1, self.master.numel())
        self.adam = DeepSpeedCPUAdam([self.master], lr=1e-2)
        self.adam.step()
        self.calls = []

    def state_dict(self):
        self.calls.append("state_dict")
        return {}

    def load_state_dict(self, state):
        self.calls.append("load_state_dict")

    def step(self):
        self.calls.append("step")

    def hold_a_step(self, later):
        from hf_zero.engine.offload_step import GroupStepInChunks

        staging = torch.empty_like(self.flat)
        later.hold(0, GroupStepInChunks(self.adam, self.adam.param_groups[0], self.master, staging, self.flat, None,
                                        4096))

    def updated(self):
        """The 16-bit weights one more step gives, computed apart."""
        import copy

        twin = copy.deepcopy(self.adam.state[self.master])
        master = self.master.detach().clone()
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        param = torch.nn.Parameter(master)
        param.grad = self.master.grad.clone()
        adam = DeepSpeedCPUAdam([param], lr=1e-2)
        adam.state[param] = twin
        adam.step()
        return param.detach().to(torch.bfloat16)


def _held(layers=3):
    from hf_zero.engine.offload_step import StepFinishedInForward

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)])  # 12,480 elements: 4 chunks
    optimizer = _Flat(model)
    later = StepFinishedInForward(optimizer, model)
    expected = optimizer.updated()
    optimizer.hold_a_step(later)
    return model, optimizer, later, expected


@pytest.mark.slow  # builds DeepSpeed's CPU Adam op (most of a minute the first time)
def test_each_layer_runs_on_its_updated_weights_and_the_forward_ends_the_step():
    model, optimizer, later, expected = _held()
    seen = []
    for layer in model:
        # runs after StepFinishedInForward's pre-hook (hooks run in the order they were registered)
        layer.register_forward_pre_hook(lambda m, args: seen.append(
            (m.weight.clone(), later.pending[0].done if later.pending else None)))
    before = optimizer.flat.clone()
    model(torch.ones(1, 64, dtype=torch.bfloat16))
    for (weight, _), layer in zip(seen, model):
        start = (layer.weight.data_ptr() - optimizer.flat.data_ptr()) // 2
        assert torch.equal(weight.reshape(-1), expected[start:start + weight.numel()])  # updated before it ran
    assert 0 < seen[0][1] < optimizer.flat.numel()  # as the first layer ran, the rest was still held
    assert not later.pending and torch.equal(optimizer.flat, expected) and not torch.equal(before, expected)


@pytest.mark.slow  # builds DeepSpeed's CPU Adam op (most of a minute the first time)
@pytest.mark.parametrize("reader", ["model state_dict", "layer state_dict", "model load_state_dict",
                                    "optimizer state_dict", "optimizer load_state_dict", "optimizer step", "finish"])
def test_reading_or_replacing_the_weights_finishes_a_held_step_first(reader):
    model, optimizer, later, expected = _held()
    if reader == "model load_state_dict":
        saved = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}  # finishes the step...
        optimizer.hold_a_step(later)  # ...so hold another, which loading must not let overwrite the loaded weights
        model.load_state_dict(saved)
        assert not later.pending and all(not p.any() for p in model.parameters())
        return
    {"model state_dict": lambda: model.state_dict(), "layer state_dict": lambda: model[2].state_dict(),
     "optimizer state_dict": lambda: optimizer.state_dict(),
     "optimizer load_state_dict": lambda: optimizer.load_state_dict({}),
     "optimizer step": lambda: optimizer.step(), "finish": later.finish}[reader]()
    assert not later.pending and torch.equal(optimizer.flat, expected)
    assert optimizer.calls in ([], [reader.split()[-1]])
