"""QLoRA under ZeRO-3: a 4-bit base whose bnb_4bit_quant_storage differs from the training dtype stays unsharded,
so hf-zero check --model refuses it with the fix; the rule reads the model's config (no bitsandbytes needed)."""

import json

import pytest

import hf_zero
from hf_zero.config.validate import validate_config


def _model_config(storage=None, dtype="bfloat16"):
    quantization = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    if storage is not None:
        quantization["bnb_4bit_quant_storage"] = storage
    return {"model_type": "llama", "dtype": dtype, "quantization_config": quantization}


def _codes(preset, model_config, **kwargs):
    return [f.code for f in validate_config(hf_zero.load_config(preset), model_config=model_config, **kwargs)]


@pytest.mark.parametrize("storage, dtype", [(None, "bfloat16"), ("uint8", "bfloat16"), ("float32", "bfloat16"),
                                            ("bfloat16", "float16")])
def test_fires_when_the_storage_is_not_the_training_dtype(storage, dtype):
    [finding] = [f for f in validate_config(hf_zero.load_config("zero3"), model_config=_model_config(storage, dtype))
                 if f.code == "qlora-quant-storage"]
    assert finding.severity == "error" and f"bnb_4bit_quant_storage=torch.{dtype}" in finding.fix


@pytest.mark.parametrize("preset, model_config", [
    ("zero3", _model_config("bfloat16")),                                    # the right setting
    ("zero3", _model_config("torch.bfloat16")),                              # spelled as torch writes it
    ("zero2", _model_config("uint8")),                                       # ZeRO-2 partitions no parameters
    ("zero3", {"model_type": "llama", "dtype": "bfloat16"}),                 # not quantized
    ("zero3", {**_model_config("uint8"), "quantization_config": {"load_in_8bit": True}}),  # 8-bit: another path
])
def test_quiet(preset, model_config):
    assert "qlora-quant-storage" not in _codes(preset, model_config)


def test_training_dtype_from_the_trainer_when_the_model_does_not_say():
    config = {k: v for k, v in _model_config("uint8").items() if k != "dtype"}
    assert "qlora-quant-storage" in _codes("zero3", config, trainer_args={"bf16": True})
    assert "qlora-quant-storage" not in _codes("zero3", config)  # "auto" with no Trainer flag: nothing to compare


def test_check_model_refuses_it(tmp_path, capsys):
    from hf_zero.cli import main

    (tmp_path / "config.json").write_text(json.dumps({**_model_config(), "hidden_size": 64, "num_hidden_layers": 2,
                                                      "intermediate_size": 128, "vocab_size": 256,
                                                      "num_attention_heads": 4}))
    assert main(["check", "zero3", "--model", str(tmp_path), "--cpu", "--no-env"]) == 1
    assert "[qlora-quant-storage]" in capsys.readouterr().out
