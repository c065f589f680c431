"""The checks a Ulysses sequence-parallel run gets before its first step: each fires on what DeepSpeed, Accelerate
or torch would refuse (or run wrongly) and stays quiet on what they run."""

from pathlib import Path

import pytest
import torch
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import DeepSpeedSequenceParallelConfig
from transformers import LlamaConfig

import hf_zero
from hf_zero.config import validate_config
from hf_zero.config.accelerate_yaml import yaml_deepspeed_config
from hf_zero.engine.checks import layout_problems
from hf_zero.sequence_parallel import (SequenceParallelBatches, attention_problems, gloo_subgroup_problems,
                                       replica_problems, sequence_parallel_problems)


def _sp(size=2, attention="sdpa", **sizes):
    return ParallelismConfig(sp_backend="deepspeed", sp_size=size, **sizes,
                             sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation=attention))


def _model_config(attention="sdpa", heads=4, kv_heads=2):
    config = LlamaConfig(hidden_size=64, num_attention_heads=heads, num_key_value_heads=kv_heads)
    config._attn_implementation = attention
    return config


class _Model:
    def __init__(self, config):
        self.config = config


def test_world_not_divisible_by_sp_size():
    [problem] = layout_problems(launched=3, sp=2)
    assert "3 processes cannot be split" in problem and "Fix: launch a multiple of 2" in problem
    assert layout_problems(launched=4, sp=2) == []


def test_query_and_key_value_heads_must_split_over_the_sp_ranks():
    [queries] = layout_problems(launched=4, sp=4, attention_heads=6, kv_heads=2)
    assert "does not divide the model's 6 attention heads" in queries
    # DeepSpeed splits 4 key/value heads over 2 ranks, or repeats 2 of them over 4 ranks
    assert layout_problems(launched=2, sp=2, attention_heads=4, kv_heads=4) == []
    assert layout_problems(launched=4, sp=4, attention_heads=8, kv_heads=2) == []
    [kv] = layout_problems(launched=4, sp=4, attention_heads=12, kv_heads=6)
    assert "4 and the model's 6 key/value heads do not divide one another" in kv


def test_attention_ulysses_cannot_wrap_is_refused():
    [eager] = attention_problems(_model_config("eager"), _sp())
    assert "attn_implementation='eager'" in eager and 'attn_implementation="sdpa"' in eager
    assert attention_problems(_model_config("sdpa"), _sp()) == []


def test_handler_attention_must_be_the_models():
    [unset] = attention_problems(_model_config("sdpa"), ParallelismConfig(sp_backend="deepspeed", sp_size=2))
    assert "sp_attn_implementation is None but the model runs 'sdpa'" in unset
    assert "sp_attn_implementation='sdpa'" in unset
    [other] = attention_problems(_model_config("sdpa"), _sp(attention="flash_attention_2"))
    assert "'flash_attention_2' but the model runs 'sdpa'" in other


def test_replicas_must_fill_the_world_left_by_sp():
    [problem] = replica_problems(_sp(), launched=4, sp=2)
    assert "dp_replicate_size x dp_shard_size = 1, not 4 / 2 = 2" in problem and "dp_replicate_size=2" in problem
    assert replica_problems(_sp(dp_replicate_size=2), launched=4, sp=2) == []
    assert replica_problems(_sp(), launched=2, sp=2) == []


def test_sp_groups_smaller_than_the_world_are_refused_on_cpu_only():
    [problem] = gloo_subgroup_problems(launched=4, sp=2, on_cpu=True)
    assert "Fix: on CPU use sp_size=4" in problem
    assert gloo_subgroup_problems(launched=2, sp=2, on_cpu=True) == []
    assert gloo_subgroup_problems(launched=4, sp=2, on_cpu=False) == []


def test_all_sp_checks_together_and_none_without_sp():
    model = _Model(_model_config("eager"))
    assert len(sequence_parallel_problems(model, _sp(), launched=4, sp=2, on_cpu=True)) == 3
    assert sequence_parallel_problems(model, None, launched=4, sp=1, on_cpu=True) == []


def _rows(width, n=2):
    return [{"input_ids": torch.arange(width), "labels": torch.arange(width)} for _ in range(n)]


def _stack(features):
    return {k: torch.stack([f[k] for f in features]) for k in features[0]}


def test_batch_width_not_divisible_by_sp_size():
    with pytest.raises(hf_zero.ConfigError, match="sequence length 15.*pad_to_multiple_of=2"):
        SequenceParallelBatches(_stack, 2)(_rows(15))
    assert SequenceParallelBatches(_stack, 2)(_rows(16))["input_ids"].shape == (2, 16)


def test_batches_without_position_ids_get_the_models_default():
    batch = SequenceParallelBatches(_stack, 2)(_rows(4))
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    packed = [{"input_ids": torch.arange(4), "position_ids": torch.tensor([0, 1, 0, 1])}]
    assert SequenceParallelBatches(_stack, 2)(packed)["position_ids"].tolist() == [[0, 1, 0, 1]]  # kept


ZERO3 = hf_zero.load_config("zero3")


def _batch_config(train, micro=2, accumulation=1, **extra):
    return {**ZERO3, "train_batch_size": train, "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accumulation, **extra}


def _codes(config, **kwargs):
    return [f.code for f in validate_config(config, world_size=2, **kwargs)]


def test_batch_under_the_trainer_counts_the_whole_world_with_sp():
    # measured: the Trainer with sp_size 2 on 2 processes runs train_batch_size 4 (micro 2); 2 fails at zero.Init
    assert "batch-arithmetic" not in _codes(_batch_config(4), sequence_parallel=2)
    assert "batch-arithmetic" in _codes(_batch_config(2), sequence_parallel=2)
    # raw DeepSpeed with Ulysses' groups counts world / sp
    assert "batch-arithmetic" not in _codes(_batch_config(2), sequence_parallel=2, trainer_fills_auto=False)


def test_sequence_parallel_size_key_breaks_zero_init_under_the_trainer():
    codes = _codes({**ZERO3, "sequence_parallel_size": 2})
    assert codes == ["sequence-parallel-size-under-trainer"]
    assert _codes(ZERO3) == []
    assert "sequence-parallel-size-under-trainer" not in _codes({**ZERO3, "sequence_parallel_size": 2},
                                                                trainer_fills_auto=False)
    fixed = hf_zero.config.rules.fix_config({**ZERO3, "sequence_parallel_size": 2},
                                            validate_config({**ZERO3, "sequence_parallel_size": 2}))
    assert "sequence_parallel_size" not in fixed


def test_sp_accelerate_yaml_is_the_zero3_preset_with_ulysses(capsys):
    import yaml

    from hf_zero.cli import main

    path = Path(__file__).resolve().parents[2] / "recipes" / "accelerate" / "zero3_sp.yaml"
    config = yaml.safe_load(path.read_text())
    assert config["distributed_type"] == "DEEPSPEED"
    assert yaml_deepspeed_config(path) == hf_zero.load_config("zero3") and config["deepspeed_config"]["zero3_init_flag"]
    block = config["parallelism_config"]
    assert block["parallelism_config_sp_backend"] == "deepspeed" and block["parallelism_config_sp_size"] == 2
    assert block["parallelism_config_sp_attn_implementation"] == "sdpa"
    assert block["parallelism_config_dp_replicate_size"] * block["parallelism_config_sp_size"] == config["num_processes"]
    # the JSON it launches passes hf_zero's own checks for that layout
    assert main(["check", "zero3", "--world-size", "2", "--sequence-parallel", "2", "--no-env", "--cpu"]) == 0
    capsys.readouterr()
