"""The long-context switch in a real ZeRO run: 2 CPU processes, the Trainer, sequences long enough that every
part runs (256 tokens at hidden 64: 4 MLP shards), the same losses as plain checkpointing and a bitwise reload."""

import pytest

from conftest import assert_reload_bitwise, assert_same_losses, assert_trained, read_result, run_worker

pytestmark = pytest.mark.multiproc


# two launches each (about 35 s): with the slow group; tests/trainer/test_long_context.py covers the switch in make test
@pytest.mark.parametrize("preset", [pytest.param("zero3", marks=pytest.mark.slow), pytest.param("zero2", marks=pytest.mark.slow)])
def test_long_context_trains_as_plain_checkpointing_does(tiny_models, tmp_path, preset):
    common = ["--model", tiny_models["llama"], "--deepspeed", preset, "--length", "256", "--steps", "3"]
    run_worker([*common, "--out", tmp_path / "plain", "--gc"], nproc=2)
    out = tmp_path / "long"
    run_worker([*common, "--out", out, "--long-context"], nproc=2)
    plain, long = read_result(tmp_path / "plain"), read_result(out)
    assert plain["use_reentrant"] is False and long["use_reentrant"] is False  # ZeroCallback's default
    assert any("turned gradient checkpointing on" in w for w in long["warnings"]), long["warnings"]
    assert_same_losses(long["losses"], plain["losses"], "long context, plain checkpointing")
    assert_trained(out, tiny_models["llama"], min_drop=0.0)
    assert_reload_bitwise(out)

