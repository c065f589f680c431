"""`hf-zero export` and `hf-zero verify` on real ZeRO checkpoints written by the Trainer."""

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import run_worker

pytestmark = pytest.mark.multiproc


def hf_zero_cli(*args):
    """The real CLI entry, in this process (importing DeepSpeed once, not per call)."""
    from hf_zero.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def consolidated(checkpoint: Path) -> dict:
    """DeepSpeed's own answer: what zero_to_fp32 reconstructs from the rank shards."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()):
        return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


@pytest.fixture(scope="module")
def gather_off_run(tiny_models, tmp_path_factory):
    """ZeRO-3 on 2 processes with 16-bit gathering off: checkpoints hold only rank shards (and the tokenizer)."""
    from hf_zero import load_config

    root = tmp_path_factory.mktemp("gather_off")
    config = load_config("zero3")
    config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    (root / "ds.json").write_text(json.dumps(config))
    out = root / "run"
    run_worker(["--model", tiny_models["llama_tok"], "--deepspeed", root / "ds.json", "--out", out, "--steps", "2",
                "--save-steps", "2", "--no-attach"], nproc=2)
    checkpoint = out / "checkpoint-2"
    assert not (checkpoint / "model.safetensors").exists(), "gathering was on: this fixture needs shards only"
    return checkpoint


def test_export_of_shards_only_zero3_matches_deepspeed_consolidation(gather_off_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    proc = hf_zero_cli("export", gather_off_run, out, "--dtype", "bf16", "--max-shard-size", "40KB")
    assert proc.returncode == 0, proc.stderr
    assert "ZeRO-3, 2 rank(s)" in proc.stdout
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").exists()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).exists(), f"{name} not carried over"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"

    expected = consolidated(gather_off_run)
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    reloaded = model.state_dict()
    assert model.dtype == torch.bfloat16
    for name, tensor in expected.items():
        assert torch.equal(reloaded[name], tensor.to(torch.bfloat16)), name
    AutoTokenizer.from_pretrained(out)
    assert hf_zero_cli("verify", out).returncode == 0


def test_export_keeps_the_trained_precision_by_default(gather_off_run, tmp_path):
    """No --dtype: the run's own dtype (config.json), so every tensor equals DeepSpeed's consolidated weights."""
    from transformers import AutoModelForCausalLM

    trained = json.loads((gather_off_run / "config.json").read_text())["dtype"]
    out = tmp_path / "exported"
    proc = hf_zero_cli("export", gather_off_run, out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["dtype"] == trained
    expected = consolidated(gather_off_run)
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype="auto").state_dict()
    assert all(reloaded[name].dtype == getattr(torch, trained) for name in expected)
    same = [name for name, tensor in expected.items() if torch.equal(reloaded[name], tensor.to(getattr(torch, trained)))]
    assert len(same) == len(expected), f"{len(same)} of {len(expected)} tensors equal the trained weights"


def test_trained_dtype_reads_config_json(tmp_path):
    from hf_zero.checkpoints.export import trained_dtype

    for name, short in (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32")):
        (tmp_path / "config.json").write_text(json.dumps({"dtype": name}))
        assert trained_dtype([tmp_path]) == short
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))  # older transformers' key
    assert trained_dtype([tmp_path]) == "bf16"
    (tmp_path / "config.json").write_text("{}")
    assert trained_dtype([tmp_path]) == "fp32"  # the fp32 masters, exact


def test_export_of_zero2_fp32_is_exact_and_drops_tied_copies(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    run = trained("gpt2", "zero2", 1, "--save-steps", "2", "--steps", "2")  # GPT-2 ties lm_head to wte
    checkpoint = run / "checkpoint-2"
    out = tmp_path / "gpt2_fp32"
    proc = hf_zero_cli("export", checkpoint, out, "--dtype", "fp32", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["stage"] == 2 and summary["tied_dropped"] == ["lm_head.weight"]
    expected = consolidated(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    reloaded = model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(reloaded[name], tensor), name
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


def test_export_refuses_a_folder_that_is_not_a_checkpoint(tiny_models, tmp_path):
    proc = hf_zero_cli("export", tiny_models["llama"], tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "holds no DeepSpeed ZeRO checkpoint" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_missing_rank_file_and_writes_nothing(gather_off_run, tmp_path):
    broken = tmp_path / "checkpoint-2"
    shutil.copytree(gather_off_run, broken)
    (broken / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    proc = hf_zero_cli("export", broken, tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt is missing" in proc.stderr
    assert not (tmp_path / "out").exists()
    verdict = hf_zero_cli("verify", broken)
    assert verdict.returncode == 1 and "zero_pp_rank_1_mp_rank_00_optim_states.pt is missing" in verdict.stdout


def test_export_into_a_non_empty_folder_needs_overwrite(gather_off_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("a user's file")
    proc = hf_zero_cli("export", gather_off_run, out)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert (out / "keep.txt").read_text() == "a user's file" and len(list(out.iterdir())) == 1
    assert hf_zero_cli("export", gather_off_run, out, "--overwrite").returncode == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()


def test_export_onto_its_own_checkpoint_keeps_the_checkpoint(gather_off_run, tmp_path):
    """`hf-zero export CKPT CKPT --overwrite` (the "not empty" message once suggested --overwrite) replaced the
    checkpoint with its export; OUT over another checkpoint was deleted the same way."""
    ckpt = tmp_path / "checkpoint-2"
    shutil.copytree(gather_off_run, ckpt)
    other = tmp_path / "other" / "checkpoint-2"
    shutil.copytree(gather_off_run, other)
    files = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for out in (ckpt, other):
        proc = hf_zero_cli("export", ckpt, out, "--overwrite")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "is the input" in proc.stderr or "never deletes a checkpoint" in proc.stderr, proc.stderr
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == files
    assert hf_zero_cli("verify", ckpt).returncode == 0


def test_verify_passes_complete_checkpoints(trained):
    run = trained("gpt2", "zero2", 1, "--save-steps", "2", "--steps", "2")
    proc = hf_zero_cli("verify", run / "checkpoint-2", run / "final")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK, complete and reloadable") == 2


def test_verify_fails_zero_size_and_wrong_shape_weights(tiny_models, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(tiny_models["llama"] / "model.safetensors"))
    for case, mutate in {"empty": lambda t: torch.empty(0), "shape": lambda t: t[:-1]}.items():
        folder = tmp_path / case
        shutil.copytree(tiny_models["llama"], folder)
        broken = dict(state, **{"model.embed_tokens.weight": mutate(state["model.embed_tokens.weight"])})
        save_file(broken, str(folder / "model.safetensors"), metadata={"format": "pt"})
        proc = hf_zero_cli("verify", folder)
        assert proc.returncode == 1, proc.stdout
        assert ("zero-size" if case == "empty" else "has shape") in proc.stdout


def test_verify_bad_input_is_one_message_exit_2(tmp_path):
    for target in (tmp_path / "missing", tmp_path):
        proc = hf_zero_cli("verify", target)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "hf-zero verify: error:" in proc.stderr


@pytest.mark.parametrize("pattern", ["*model_states.pt", "*optim_states.pt"])
def test_export_and_verify_refuse_a_shard_that_would_run_code(gather_off_run, tmp_path, pattern):
    from pickle_bombs import bombed_copy

    marker = tmp_path / "code_ran"
    bombed, target = bombed_copy(gather_off_run, tmp_path / "checkpoint-2", marker, pattern)
    for args in (("export", bombed, tmp_path / "out"), ("verify", bombed)):
        proc = hf_zero_cli(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert target.name in proc.stderr and "would import io.open" in proc.stderr and "--trust-checkpoint" in proc.stderr
    assert not marker.exists(), "a checkpoint pickle ran code"
    assert not (tmp_path / "out").exists()
    # the real shards of the same run pass both
    assert hf_zero_cli("verify", gather_off_run).returncode == 0
