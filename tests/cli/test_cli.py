"""The hf-zero command: right answers, and bad input as one message with exit code 2."""

import json
import subprocess
import sys

import pytest

from hf_zero.cli import main
from hf_zero.config import preset_path
from hf_zero.config.accelerate_yaml import yaml_deepspeed_config


def test_presets_lists_each_preset_with_a_line(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in sorted(path.stem for path in preset_path("zero3").parent.glob("*.json")):
        assert f"\n{name} " in "\n" + out



def test_presets_prints_the_path(capsys):
    assert main(["presets", "zero3"]) == 0
    path = capsys.readouterr().out.strip()
    assert path.endswith("zero3.json") and json.loads(open(path).read())["zero_optimization"]["stage"] == 3


def test_presets_writes_nvme_config_and_accelerate_yaml(tmp_path, capsys):
    out = tmp_path / "ds.json"
    yaml_out = tmp_path / "acc.yaml"
    assert main(["presets", "zero3_nvme", "--nvme-path", str(tmp_path), "--out", str(out),
                 "--accelerate-config", str(yaml_out)]) == 0
    assert json.loads(out.read_text())["zero_optimization"]["offload_param"]["nvme_path"] == str(tmp_path)
    # the YAML carries the resolved config inline, as the preset's YAML carries the preset
    assert yaml_deepspeed_config(yaml_out) == json.loads(out.read_text())
    assert main(["presets", "zero3_nvme", "--nvme-path", str(tmp_path)]) == 2  # nowhere to write it
    assert "--nvme-path needs --out FILE or --accelerate-config FILE" in capsys.readouterr().err


def test_presets_torch_compile_writes_accelerates_dynamo_config(tmp_path, capsys):
    from accelerate.commands.config.config_args import load_config_from_file

    plain, compiled = tmp_path / "plain.yaml", tmp_path / "compiled.yaml"
    assert main(["presets", "zero2", "--accelerate-config", str(plain)]) == 0
    assert main(["presets", "zero2", "--accelerate-config", str(compiled), "--torch-compile"]) == 0
    assert load_config_from_file(str(plain)).dynamo_config == {}  # quiet: the shipped preset compiles nothing
    config = load_config_from_file(str(compiled))  # Accelerate's own reader
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR", "dynamo_use_regional_compilation": True}
    assert json.loads(config.deepspeed_config["deepspeed_config_file"]) == json.loads(open(preset_path("zero2")).read())
    assert "note:" not in capsys.readouterr().err
    assert main(["presets", "zero3", "--accelerate-config", str(compiled), "--torch-compile"]) == 0
    assert "ZeroCallback" in capsys.readouterr().err  # ZeRO-3: compile through the Trainer and the callback
    assert load_config_from_file(str(compiled)).dynamo_config["dynamo_use_regional_compilation"] is True
    assert main(["presets", "zero2", "--torch-compile"]) == 2
    assert "add --accelerate-config" in capsys.readouterr().err


def test_check_preset_clean(capsys):
    assert main(["check", "zero2", "--cpu"]) == 0
    assert "OK" in capsys.readouterr().out


def test_check_reports_all_findings_exit_1(tmp_path, capsys):
    path = tmp_path / "tutorial.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_checkpointing": True,
                                "fp16": {"enabled": True}, "zero_optimization": {"stage": 3, "bogus": 1}}))
    assert main(["check", str(path), "--cpu", "--json"]) == 1
    found = {f["code"] for f in json.loads(capsys.readouterr().out)}
    assert found == {"unknown-key", "fp16-on-cpu", "zero3-no-gather"}


@pytest.mark.parametrize("argv, message", [
    (["presets", "zero9"], "unknown preset 'zero9'"),
    (["check", "zero9"], "unknown preset 'zero9'"),
    (["check", "/nonexistent/ds.json"], "no such file"),
])
def test_bad_input_one_message_exit_2(argv, message):
    # a real process: what a user sees, traceback or not
    proc = subprocess.run([sys.executable, "-m", "hf_zero", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_invalid_json_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    assert main(["check", str(path)]) == 2
    assert "invalid JSON" in capsys.readouterr().err


def test_finetune_subcommand_bad_model_exit_2(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("text,label\na,0\nb,1\n")
    assert main(["finetune", "--model", str(tmp_path / "missing"), "--data", str(data)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": "auto"},
     "does not support fp16"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}, "train_micro_batch_size_per_gpu": "auto"},
     "DeepSpeed does not know the key zero_optimization.reduce_bucket_sise"),
])
def test_finetune_refuses_a_bad_config_before_training(tmp_path, capsys, config, message):
    if __import__("torch").cuda.is_available() and "fp16" in message:
        pytest.skip("fp16 is fine on GPUs")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    data = tmp_path / "d.csv"
    data.write_text("text,label\na,0\nb,1\n")
    assert main(["finetune", "--model", str(tmp_path), "--data", str(data), "--preset", str(path),
                 "--output_dir", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_check_against_args_model_and_fix(tmp_path, capsys, tiny_models):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                                  "gradient_checkpointing": True, "fp16": {"enabled": True},
                                  "zero_optimization": {"stage": 2}}))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 4}))
    fixed = tmp_path / "fixed.json"
    assert main(["check", str(config), "--args", str(args), "--model", str(tiny_models["llama"]), "--no-env",
                 "--fix", str(fixed), "--json"]) == 1
    found = {f["code"] for f in json.loads(capsys.readouterr().out)}
    assert {"trainer-mismatch", "unknown-key"} <= found
    assert main(["check", str(fixed), "--args", str(args), "--no-env", "--cpu"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["check", "zero2", "--model", "/nonexistent/model"], "neither a folder"),
    (["check", "zero2", "--args", "/nonexistent.json"], "does not exist"),
])
def test_check_bad_side_inputs_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [("[1, 2]", "not an object"), ("", "invalid JSON"), ("{\"a\": NaN", "invalid JSON")])
def test_check_not_a_config_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "ds.json"
    path.write_text(content)
    assert main(["check", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["empty.json", "empty.jsonl", "empty.csv"])
def test_finetune_on_an_empty_data_file_is_one_message(tiny_models, tmp_path, capsys, name):
    data = tmp_path / name
    data.write_text("")
    assert main(["finetune", "--model", str(tiny_models["llama_tok"]), "--data", str(data), "--task", "causal_lm",
                 "--output_dir", str(tmp_path / "out"), "--no_reload_check"]) == 2
    err = capsys.readouterr().err
    assert f"{name}' holds no rows" in err and "Traceback" not in err and err.count("error:") == 1, err
