"""A user's own Accelerate loop under the presets' YAMLs: hf_zero.accelerator(), hf_zero.prepare, save_pretrained."""

import time

import pytest
import torch

from conftest import REPO, assert_reload_bitwise, assert_same_losses, differing_tensors, read_result, run_worker
from hf_zero.long_context import LongContext

pytestmark = pytest.mark.multiproc
LOOP_WORKER = REPO / "tests" / "workers" / "train_accelerate.py"


def _run(tiny_models, out, preset, *flags, expect_fail=False):
    return run_worker(["--model", tiny_models["llama"], "--out", out, *flags], nproc=2,
                      launcher=f"accelerate:{preset}", script=LOOP_WORKER, expect_fail=expect_fail)


def test_zero3_loop_trains_partitioned_and_saves_a_model_that_reloads_bitwise(accelerate_zero3_loop):
    out = accelerate_zero3_loop
    result = read_result(out)
    assert result["engine"] == "DeepSpeedEngine" and result["dp_world_size"] == 2 and result["partitioned_at_load"]
    # the preset names no optimizer: the DummyOptim got DeepSpeed's AdamW, with torch's betas/eps as it names none
    assert result["optimizer"] == "FusedAdam" and result["betas"] == [0.9, 0.999] and result["eps"] == 1e-8
    assert result["losses"][-1] < result["losses"][0]
    assert_reload_bitwise(out)


@pytest.mark.slow
def test_zero2_loop_with_a_torch_adamw_keeps_its_hyperparameters(tiny_models, tmp_path):
    out = tmp_path / "loop"
    _run(tiny_models, out, "zero2", "--optimizer", "torch")
    result = read_result(out)
    assert result["optimizer"] == "AdamW" and result["betas"] == [0.9, 0.95] and result["eps"] == 1e-6
    assert result["dp_world_size"] == 2 and result["losses"][-1] < result["losses"][0]
    assert_reload_bitwise(out)


@pytest.mark.slow  # the CPU Adam and a two-process offload run, about a minute
def test_prepare_applies_the_offload_fixes_the_trainer_gets(tiny_models, tmp_path):
    # zero2_offload: DeepSpeed's per-gradient host test goes, as ZeroCallback removes it under the Trainer
    out = tmp_path / "loop"
    _run(tiny_models, out, "zero2_offload")
    result = read_result(out)
    assert result["engine_fixes"] == ["update_offload_overflow_tracker"]
    assert result["losses"][-1] < result["losses"][0]
    assert_reload_bitwise(out)


@pytest.mark.slow  # two one-process offload runs with the CPU Adam, about a minute
def test_prepare_can_leave_the_offload_step_to_the_next_forward_with_the_same_bits(tiny_models, tmp_path):
    # one process (the fix stays out on more): chunks of 4,096 elements split the tiny Llama's partition many times
    def run(out, *flags):
        run_worker(["--model", tiny_models["llama"], "--out", out, *flags], nproc=1,
                   launcher="accelerate:zero2_offload", script=LOOP_WORKER)
        return read_result(out)

    deepspeed_step = run(tmp_path / "deepspeed_step")
    # exact on any CPU: the same CPU Adam on the same elements, later and in 4,096-element chunks (a multiple of its
    # vector tile); the next forward then reads the same weights
    held = run(tmp_path / "held", "--offload-step-in-forward", "4096")
    assert not deepspeed_step["step_in_forward"] and held["step_in_forward"]
    assert held["step_held_at_end"]  # the last step waited for the save's state_dict
    assert held["losses"] == deepspeed_step["losses"] and held["losses"][-1] < held["losses"][0]
    assert differing_tensors(tmp_path / "deepspeed_step" / "expected.safetensors",
                             tmp_path / "held" / "expected.safetensors") == {}
    assert_reload_bitwise(tmp_path / "held")


@pytest.mark.parametrize("chunk, fires", [(1000, True), (0, True), (4096, False)])
def test_prepare_checks_the_chunk_before_anything_is_built(chunk, fires):
    import hf_zero
    from hf_zero.errors import ConfigError

    sentinel = object()  # stands for the Accelerator: with a sound chunk, prepare goes on to use it

    try:
        hf_zero.prepare(sentinel, torch.nn.Linear(2, 2), offload_step_in_forward=True, offload_step_chunk=chunk)
    except ConfigError as e:
        assert fires and "multiple of 4,096" in str(e)
    except AttributeError:
        assert not fires  # it went on to read the Accelerator's state
    else:
        raise AssertionError("prepare returned with an object standing for the Accelerator")


@pytest.mark.slow  # both checks it covers keep quick tests in make test (test_batch_counts, test_saved_models)
def test_a_save_on_one_rank_only_is_refused_and_writes_nothing(tiny_models, tmp_path):
    out = tmp_path / "loop"
    (out / "final").mkdir(parents=True)
    (out / "final" / "config.json").write_text("{}")  # an earlier save, which must survive
    proc = _run(tiny_models, out, "zero3", "--save-on-main-only", expect_fail=True)
    assert "not all of them arrived" in proc.stderr and "is_main_process" in proc.stderr
    assert "uneven batches" not in proc.stderr  # every rank's loader has as many batches
    assert sorted(p.name for p in (out / "final").iterdir()) == ["config.json"]


def test_a_plain_accelerator_on_cpu_is_stopped_before_ranks_train_alone(tiny_models, tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("a CPU-machine pitfall: on GPUs a plain Accelerator is right")
    proc = _run(tiny_models, tmp_path / "loop", "zero2", "--plain-accelerator", expect_fail=True)
    assert "data-parallel world size of 1, but 2 processes were launched" in proc.stderr
    assert "hf_zero.accelerator()" in proc.stderr


@pytest.mark.slow
def test_long_context_in_a_loop_trains_as_without_it(tiny_models, tmp_path):
    """hf_zero.enable_long_context(model) and gradient checkpointing in a user's loop (zero3 YAML, 256-token
    samples: 4 MLP shards at hidden 64): the losses of the loop without them, and a bitwise reload."""
    _run(tiny_models, tmp_path / "plain", "zero3", "--length", "256")
    out = tmp_path / "long"
    _run(tiny_models, out, "zero3", "--length", "256", "--long-context")
    plain, long = read_result(tmp_path / "plain"), read_result(out)
    assert long["long_context"] == str(LongContext()) and long["checkpointing"] and not plain["checkpointing"]
    assert_same_losses(long["losses"], plain["losses"], "long context in a loop, plain loop")
    assert long["losses"][-1] < long["losses"][0]
    assert_reload_bitwise(out)


def test_a_dummy_optim_gets_deepspeeds_adamw_only_where_the_config_names_none():
    from accelerate.utils import DummyOptim

    from hf_zero.accelerate import deepspeed_adamw_for

    params = list(torch.nn.Linear(2, 2).parameters())
    config = {"zero_optimization": {"stage": 2}}
    note = deepspeed_adamw_for(config, DummyOptim(params, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95)))
    assert "DeepSpeed's AdamW" in note
    assert config["optimizer"] == {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1,
                                                                       "betas": [0.9, 0.95], "eps": 1e-8}}
    own = {"optimizer": {"type": "Lamb", "params": {"lr": "auto"}}}
    assert deepspeed_adamw_for(own, DummyOptim(params, lr=1e-3)) is None  # a config's own optimizer stays
    assert own == {"optimizer": {"type": "Lamb", "params": {"lr": "auto"}}}


def test_uneven_batches_per_rank_are_named_up_front_and_stop_a_zero3_loop_within_seconds(tiny_models, tmp_path):
    # even_batches=False: rank 0 has a batch more, and its extra forward gathers weights rank 1 (in the save) never
    # sends; plain DeepSpeed waits there until gloo's 30-minute timeout
    out = tmp_path / "loop"
    started = time.monotonic()
    proc = _run(tiny_models, out, "zero3", "--uneven", expect_fail=True)
    took = time.monotonic() - started
    assert "uneven batches per rank: the data loader prepared with the model yields 3 on rank 0, 2 on rank 1" \
        in proc.stderr  # the WARNING at prepare
    assert "ZeRO-3 ranks diverged" in proc.stderr and "The likely cause: uneven batches per rank" in proc.stderr
    assert "even_batches=True" in proc.stderr
    assert not (out / "final").exists()
    assert took < 90, f"the stop took {took:.0f} s"  # the launch and 2 steps take about 40 s; the hang is cut short


@pytest.mark.slow  # ZeRO-2 has no gather to watch: the save's arrival wait (10 s here) is the limit
def test_uneven_batches_are_named_when_the_save_waits_for_a_rank_still_in_its_extra_step(tiny_models, tmp_path):
    out = tmp_path / "loop"
    proc = _run(tiny_models, out, "zero2", "--uneven", "--arrival-timeout", "10", expect_fail=True)
    assert "not all of them arrived" in proc.stderr and "the likely cause is uneven batches per rank" in proc.stderr
    assert "is_main_process" not in proc.stderr.split("not all of them arrived")[1].split("\n")[0]
    assert not (out / "final").exists()
