"""Resuming ZeRO runs: exactly on the same world size, through universal checkpoints on another,
and safely after a rank was killed in the middle of a save."""

import pytest
import torch
from transformers.trainer_utils import get_last_checkpoint

from conftest import read_result, run_worker

pytestmark = pytest.mark.multiproc


def resume_run(tiny_models, out, preset, nproc, checkpoint, *flags):
    run_worker(["--model", tiny_models["llama"], "--out", out, "--deepspeed", preset, "--steps", "4",
                "--resume", checkpoint, *flags], nproc=nproc)
    return read_result(out)


def assert_continues(resumed: dict, uninterrupted: dict, exact: bool):
    """Steps 3-4 after resuming from checkpoint-2 give the uninterrupted run's losses: training went on
    from the saved weights and Adam states, it did not restart. Under the "warmup" schedule the learning rate
    moves every step, so a scheduler that restarted or lost its state shows in the logged rates."""
    assert resumed["loss_steps"] == [1, 2, 3, 4]  # 1-2 restored from trainer_state.json, 3-4 trained now
    assert resumed["learning_rates"] == uninterrupted["learning_rates"][:4]
    assert resumed["steps_trained"] == [3, 4], "this run did not start from the checkpoint's step"
    got, want = torch.tensor(resumed["losses"][2:]), torch.tensor(uninterrupted["losses"][2:4])
    if exact:
        # the first step after resuming runs on the restored weights: bit for bit the same loss; later
        # steps agree to float rounding (measured: 1 in 1e7 on ZeRO-2 at step 4, the optimizer step order)
        assert got[0].item() == want[0].item(), (got.tolist(), want.tolist())
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    else:  # another world size sums the same gradients in another order
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def same_size_case(trained, tiny_models, tmp_path, preset, nproc):
    base = trained("llama", preset, nproc, "--save-steps", "2", "--schedule", "warmup")
    resumed = resume_run(tiny_models, tmp_path / "resumed", preset, nproc, base / "checkpoint-2", "--schedule", "warmup")
    assert resumed["resumed_from"] == str(base / "checkpoint-2")
    assert_continues(resumed, read_result(base), exact=True)


@pytest.mark.long
def test_resume_same_world_size_is_exact(trained, tiny_models, tmp_path):
    same_size_case(trained, tiny_models, tmp_path, "zero2", 2)


@pytest.mark.long
@pytest.mark.parametrize("preset, nproc", [("zero1", 1), ("zero1", 2), ("zero2", 1), ("zero3", 1), ("zero3", 2)])
def test_resume_same_world_size_is_exact_every_stage(trained, tiny_models, tmp_path, preset, nproc):
    same_size_case(trained, tiny_models, tmp_path, preset, nproc)


def world_size_change_case(trained, tiny_models, tmp_path, preset, saved_on, resumed_on):
    # the same 4 samples per optimizer step on either side: 2 ranks x 2, or 1 rank x 2 micro-batches x 2
    accum = {1: "2", 2: "1"}
    base = trained("llama", preset, saved_on, "--save-steps", "2", "--accum", accum[saved_on], "--schedule", "warmup")
    checkpoint = base / "checkpoint-2"
    resumed = resume_run(tiny_models, tmp_path / "resumed", preset, resumed_on, checkpoint, "--accum", accum[resumed_on],
                         "--schedule", "warmup")
    assert resumed["resumed_from"] == str(checkpoint)
    assert (checkpoint / "global_step2_universal" / "zero").is_dir()
    assert (checkpoint / "latest_universal").read_text().strip() == "global_step2_universal"
    assert resumed["dp_world_size"] == resumed_on
    assert_continues(resumed, read_result(base), exact=False)


@pytest.mark.parametrize("preset, saved_on, resumed_on", [
    ("zero3", 2, 1), pytest.param("zero2", 1, 2, marks=pytest.mark.long)])
def test_resume_on_another_world_size_continues(trained, tiny_models, tmp_path, preset, saved_on, resumed_on):
    world_size_change_case(trained, tiny_models, tmp_path, preset, saved_on, resumed_on)


@pytest.mark.long
@pytest.mark.parametrize("preset, saved_on, resumed_on", [("zero3", 1, 2), ("zero2", 2, 1), ("zero1", 2, 1)])
def test_resume_on_another_world_size_every_stage(trained, tiny_models, tmp_path, preset, saved_on, resumed_on):
    world_size_change_case(trained, tiny_models, tmp_path, preset, saved_on, resumed_on)


@pytest.mark.long
def test_resume_without_hf_zero_fails_on_another_world_size(trained, tiny_models, tmp_path):
    """What prepare_resume fixes: the Trainer's own resume refuses the 2-rank checkpoint on 1 rank."""
    base = trained("llama", "zero3", 2, "--save-steps", "2", "--accum", "1")
    proc = run_worker(["--model", tiny_models["llama"], "--out", tmp_path / "plain", "--deepspeed", "zero3", "--steps", "4",
                       "--plain-resume", base / "checkpoint-2"], nproc=1, expect_fail=True)
    assert "DP world size of 2" in proc.stdout + proc.stderr


@pytest.mark.long  # three launches (about 50 s); make test-long, which CI runs
def test_rank_killed_mid_save_leaves_a_recognisable_partial_and_the_last_good_checkpoint(trained, tiny_models, tmp_path):
    from hf_zero import checkpoint_problems, last_good_checkpoint

    out = tmp_path / "run"
    common = ["--model", tiny_models["llama"], "--out", out, "--deepspeed", "zero3", "--steps", "6", "--save-steps", "2",
              "--save-total-limit", "1"]
    run_worker(common + ["--kill-during-save", "4"], nproc=2, expect_fail=True)

    # The previous checkpoint survived rotation and is complete; the cut one says what is missing.
    assert checkpoint_problems(out / "checkpoint-2") == []
    problems = " ".join(checkpoint_problems(out / "checkpoint-4"))
    assert "trainer_state.json" in problems and "zero_pp_rank_1_mp_rank_00_optim_states.pt is truncated" in problems
    assert get_last_checkpoint(str(out)).endswith("checkpoint-4"), "the Trainer alone would resume from the partial one"
    assert last_good_checkpoint(out) == out / "checkpoint-2"

    # Run again with resume: the partial folder is set aside (not deleted), training continues exactly
    # from checkpoint-2, and rotation keeps only the newest verified checkpoint.
    run_worker(common + ["--resume", "last"], nproc=2)
    result = read_result(out)
    assert result["resumed_from"] == str(out / "checkpoint-2") and result["steps_trained"] == [3, 4, 5, 6]
    assert (out / "partial-checkpoint-4" / "global_step4").is_dir()
    assert any("set aside incomplete checkpoint" in w for w in result["warnings"])
    assert_continues(dict(result, losses=result["losses"][:4], loss_steps=result["loss_steps"][:4],
                          learning_rates=result["learning_rates"][:4], steps_trained=result["steps_trained"][:2]),
                     read_result(trained("llama", "zero3", 2)), exact=True)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6"]
    assert checkpoint_problems(out / "checkpoint-6") == []
