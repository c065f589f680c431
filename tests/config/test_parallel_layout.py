"""Sequence and tensor parallelism shrink the data-parallel world: the checks accept those runs and still catch a
CPU run whose ranks each train alone."""

import pytest

from hf_zero.cli import main
from hf_zero.config import validate_config
from hf_zero.engine.checks import data_parallel_problems, layout_problems, parallel_sizes


class _Parallelism:  # the two fields of accelerate's ParallelismConfig that decide the data-parallel size
    def __init__(self, sp_size, sp_backend="deepspeed"):
        self.sp_size, self.sp_backend = sp_size, sp_backend


def test_parallel_sizes_read_ulysses_and_autotp():
    from accelerate.parallelism_config import ParallelismConfig

    assert parallel_sizes({}) == (1, 1)
    assert parallel_sizes({}, ParallelismConfig(sp_backend="deepspeed", sp_size=2)) == (2, 1)
    assert parallel_sizes({"tensor_parallel": {"autotp_size": 4}}) == (1, 4)
    assert parallel_sizes({}, _Parallelism(2, sp_backend=None)) == (1, 1)


def test_engine_world_check_accepts_sequence_and_tensor_parallel_runs():
    assert data_parallel_problems(seen=2, launched=4, sp=2) == []
    assert data_parallel_problems(seen=1, launched=2, tp=2) == []
    assert data_parallel_problems(seen=2, launched=2) == []


def test_engine_world_check_still_catches_ranks_training_alone():
    [alone] = data_parallel_problems(seen=1, launched=2)
    assert "data-parallel world size of 1, but 2 processes were launched" in alone
    [sp_alone] = data_parallel_problems(seen=1, launched=4, sp=2)  # each rank alone: 1, not 4 / 2
    assert "sequence parallel 2 x tensor parallel 1 make 2" in sp_alone


def test_layouts_that_do_not_divide_are_refused_before_the_engine():
    [world] = layout_problems(launched=6, sp=4)
    assert "6 processes cannot be split" in world
    [heads] = layout_problems(launched=4, sp=4, attention_heads=6)
    assert "does not divide the model's 6 attention heads" in heads
    assert layout_problems(launched=4, sp=2, attention_heads=8) == []
    assert layout_problems(launched=3) == []


BATCH = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}


def _codes(**kwargs):
    return [f.code for f in validate_config({**BATCH, **kwargs.pop("extra", {})}, **kwargs)]


def test_batch_arithmetic_counts_data_parallel_ranks_under_sequence_and_tensor_parallelism():
    # raw DeepSpeed with Ulysses' groups: 2 x 1 x (8 / 2); under the Trainer the whole world counts (it fills and
    # matches train_batch_size over all ranks; tests/config/test_sequence_parallel_checks.py)
    assert "batch-arithmetic" not in _codes(world_size=8, sequence_parallel=2, trainer_fills_auto=False)
    assert "batch-arithmetic" in _codes(world_size=8, sequence_parallel=2)
    assert "batch-arithmetic" not in _codes(world_size=8, extra={"tensor_parallel": {"autotp_size": 2}})
    assert "batch-arithmetic" in _codes(world_size=8)  # 2 x 1 x 8 = 16


def test_check_cli_takes_the_sequence_parallel_size(capsys):
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(BATCH, f)
    assert main(["check", f.name, "--world-size", "8", "--sequence-parallel", "2", "--raw", "--no-env", "--json"]) == 0
    assert main(["check", f.name, "--world-size", "4", "--sequence-parallel", "2", "--no-env", "--json"]) == 0
    assert main(["check", f.name, "--world-size", "8", "--no-env", "--json"]) == 1
    capsys.readouterr()
    assert main(["check", f.name, "--sequence-parallel", "0"]) == 2
    assert "--sequence-parallel must be at least 1" in capsys.readouterr().err
