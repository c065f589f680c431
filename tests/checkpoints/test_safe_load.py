"""The pickle defences, against real DeepSpeed checkpoints and against files made to run code."""

import io
import os
import pickle
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from conftest import REPO, launch_command, worker_env
from hf_zero.errors import CheckpointError, HfZeroError
from hf_zero.checkpoints.safe_load import (
    UnsafeCheckpointError,
    allowed_globals,
    check_checkpoint,
    checkpoint_files,
    disallowed_globals,
    guard_deepspeed_loads,
    pickle_globals,
    safe_torch_load,
)
from pickle_bombs import bombed_copy, write_bomb

# ZeRO-1 writes the same files as ZeRO-2 (both are stage_1_and_2.py; the same globals were seen in fp32, bf16,
# 1 and 2 processes): it is checked apart, under the slow marker, to keep this file quick
STAGES = ("zero2", "zero3")
DEEPSPEED_CLASSES = {("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), ("deepspeed.runtime.zero.config", "ZeroStageEnum")}


@pytest.fixture(scope="module")
def checkpoints(tiny_models, tmp_path_factory):
    """checkpoint-2/ of a 2-step run for ZeRO-2 and ZeRO-3 (workers in parallel), plus zero2's universal conversion."""
    root = tmp_path_factory.mktemp("safe_load_ckpts")
    procs = {}
    for stage in STAGES:
        args = ["--model", tiny_models["llama"], "--out", root / stage, "--deepspeed", stage, "--steps", "2", "--save-steps", "2"]
        procs[stage] = subprocess.Popen(launch_command("python", 1, [str(a) for a in args]), cwd=REPO, env=worker_env(),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for stage, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{stage} worker failed:\n{out[-6000:]}"
    found = {stage: root / stage / "checkpoint-2" for stage in STAGES}
    # the universal files, converted by DeepSpeed's own converter under the guard (which also tests it)
    found["universal"] = _to_universal(found["zero2"], root / "universal")
    return found


def _to_universal(checkpoint, dest):
    import shutil

    from deepspeed.checkpoint import ds_to_universal

    shutil.copytree(checkpoint, dest)
    argv = ["ds_to_universal", "--input_folder", str(dest / "global_step2"), "--output_folder",
            str(dest / "global_step2_universal"), "--inject_missing_state", "--num_extract_workers", "1",
            "--num_merge_workers", "1"]
    saved, sys.argv = sys.argv, argv
    try:
        with guard_deepspeed_loads(dest / "global_step2"):
            ds_to_universal.main(ds_to_universal.parse_arguments())
    finally:
        sys.argv = saved
    return dest / "global_step2_universal"


# --- real checkpoints pass -----------------------------------------------------------------

@pytest.mark.parametrize("kind", [*STAGES, "universal"])
def test_real_checkpoints_pass_scan_and_weights_only_load(checkpoints, kind):
    files = check_checkpoint(checkpoints[kind])
    names = {p.name for p in files}
    if kind == "universal":
        assert {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "optimizer_state.pt"} <= names
    else:
        assert any(n.endswith("model_states.pt") for n in names) and any(n.endswith("optim_states.pt") for n in names)
        assert "rng_state.pth" in names
    seen = set()
    for path in files:
        seen |= pickle_globals(path)
        safe_torch_load(path, map_location="cpu")  # what the scan passes, weights_only loads too
    assert seen <= allowed_globals()
    # the scan really sees DeepSpeed's classes in the optimizer states: the allow-list is not vacuous
    assert DEEPSPEED_CLASSES <= seen


@pytest.mark.slow
def test_stage1_checkpoint_passes_scan_and_guarded_consolidation(trained):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    checkpoint = trained("llama", "zero1", 1, "--steps", "2", "--save-steps", "2") / "checkpoint-2"
    seen = set().union(*(pickle_globals(p) for p in check_checkpoint(checkpoint)))
    assert DEEPSPEED_CLASSES <= seen <= allowed_globals()
    plain = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    with guard_deepspeed_loads(checkpoint):
        guarded = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    assert plain.keys() == guarded.keys() and all(torch.equal(plain[k], guarded[k]) for k in plain)


def test_training_args_bin_is_never_scanned_nor_needed(checkpoints):
    # It holds a whole TrainingArguments (accelerate's PartialState inside): no plain-data allow-list passes it,
    # and neither the Trainer nor hf_zero ever loads it, so check_checkpoint leaves it out.
    bin_file = checkpoints["zero3"] / "training_args.bin"
    assert bin_file.exists() and bin_file not in checkpoint_files(checkpoints["zero3"])
    assert any(name.startswith("accelerate.") for name in disallowed_globals(bin_file))


# --- a shard that runs code is refused -----------------------------------------------------

@pytest.mark.parametrize("stage, pattern", [("zero2", "*model_states.pt"), ("zero3", "*optim_states.pt")])
def test_bombed_shard_refused_with_file_and_global(checkpoints, tmp_path, stage, pattern):
    marker = tmp_path / "pwned"
    folder, bomb = bombed_copy(checkpoints[stage], tmp_path / "ck", marker, pattern)
    with pytest.raises(UnsafeCheckpointError) as info:
        check_checkpoint(folder)
    message = str(info.value)
    assert str(bomb) in message and "io.open" in message and "--trust-checkpoint" in message
    assert isinstance(info.value, (CheckpointError, HfZeroError))  # so the CLI prints it and exits 2
    with pytest.raises(UnsafeCheckpointError, match="io.open"):
        safe_torch_load(bomb)
    assert not marker.exists()
    # the same folder is accepted when the user vouches for it
    assert check_checkpoint(folder, trust=True) == []


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_bomb_is_real_and_only_trust_runs_it(tmp_path, legacy):
    marker = tmp_path / "pwned"
    bomb = write_bomb(tmp_path / "shard.pt", marker, legacy=legacy)
    assert ("io", "open") in pickle_globals(bomb)
    with pytest.raises(UnsafeCheckpointError, match=f"{bomb}.*io.open"):
        safe_torch_load(bomb)
    assert not marker.exists()
    safe_torch_load(bomb, trust=True)  # weights_only=False: the payload runs, proving the test could fail
    assert marker.exists()


# --- the guard forces weights_only on DeepSpeed's own loads --------------------------------

def test_guard_overrides_an_explicit_weights_only_false(tmp_path):
    marker = tmp_path / "pwned"
    bomb = write_bomb(tmp_path / "mp_rank_00_model_states.pt", marker)
    before = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    with pytest.raises(UnsafeCheckpointError) as info:
        with guard_deepspeed_loads():
            torch.load(bomb, weights_only=False)  # what DeepSpeed's 44 call sites pass
    assert str(bomb) in str(info.value) and "io.open" in str(info.value)
    assert not marker.exists()
    assert {k: os.environ.get(k) for k in before} == before  # the switch is undone
    with guard_deepspeed_loads(trust=True):
        torch.load(bomb, weights_only=False)
    assert marker.exists()


def test_guard_lets_deepspeed_consolidate_and_refuses_a_bomb(checkpoints, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for stage in STAGES:
        plain = get_fp32_state_dict_from_zero_checkpoint(str(checkpoints[stage]))
        with guard_deepspeed_loads(checkpoints[stage]):
            guarded = get_fp32_state_dict_from_zero_checkpoint(str(checkpoints[stage]))
        assert plain.keys() == guarded.keys() and all(torch.equal(plain[k], guarded[k]) for k in plain)
    marker = tmp_path / "pwned"
    folder, bomb = bombed_copy(checkpoints["zero3"], tmp_path / "ck", marker, "*optim_states.pt")
    # without the folder scan: the forced weights_only load itself refuses, and names the file
    with pytest.raises(UnsafeCheckpointError, match="io.open"):
        with guard_deepspeed_loads():
            get_fp32_state_dict_from_zero_checkpoint(str(folder))
    with pytest.raises(UnsafeCheckpointError, match=str(bomb)):
        with guard_deepspeed_loads(folder):
            get_fp32_state_dict_from_zero_checkpoint(str(folder))
    assert not marker.exists()


def test_universal_conversion_ran_under_the_guard(checkpoints):
    # _to_universal converted zero2 with every DeepSpeed load forced to weights_only
    assert len(list(checkpoints["universal"].rglob("fp32.pt"))) == 21  # one per parameter of the tiny Llama


# --- the scanner itself --------------------------------------------------------------------

def _pickle_file(tmp_path, data: bytes) -> Path:
    path = tmp_path / "f.pt"
    path.write_bytes(data)
    return path


def test_scanner_follows_stack_global_through_the_memo(tmp_path):
    from collections import Counter

    # protocol 4: STACK_GLOBAL; "collections" is memoized once and fetched with BINGET for the second class
    data = pickle.dumps([OrderedDict(), Counter()], protocol=4)
    import pickletools

    assert any(op.name == "BINGET" for op, _, _ in pickletools.genops(data))
    assert pickle_globals(_pickle_file(tmp_path, data)) == {("collections", "OrderedDict"), ("collections", "Counter")}


@pytest.mark.parametrize("data, expected", [
    # protocol 0 GLOBAL, py2 module name mapped as find_class maps it
    (b"c__builtin__\neval\n(S'1'\ntR.", ("builtins", "eval")),
    # INST imports too
    (b"(S'ls'\nios\nsystem\n.", ("os", "system")),
])
def test_scanner_finds_every_import_opcode(tmp_path, data, expected):
    assert expected in pickle_globals(_pickle_file(tmp_path, data))
    with pytest.raises(UnsafeCheckpointError, match=".".join(expected)):
        check_checkpoint(_pickle_file(tmp_path, data))


@pytest.mark.parametrize("data, reason", [
    # "os" "system" pushed, then a third string popped: the names come off the stack by a route the scan does not follow
    (b"\x80\x04\x8c\x02os\x8c\x06system\x8c\x01xN0\x93.", "STACK_GLOBAL"),
    (b"\x80\x02\x82\x01.", "EXT1"),  # copyreg's extension registry
    (b"\x80\x02c__builtin__\neva", "not a complete pickle"),  # truncated
    (b"", "empty file"),
    (b"PK\x03\x04garbage", "not a readable torch.save archive"),
])
def test_scanner_unsure_means_refused(tmp_path, data, reason):
    path = _pickle_file(tmp_path, data)
    with pytest.raises(UnsafeCheckpointError, match=reason) as info:
        check_checkpoint(path)
    assert "--trust-checkpoint" in str(info.value)


def test_plain_pickle_after_a_fake_magic_is_scanned_to_the_end(tmp_path):
    # a non-torch pickle stream: every pickle in it is scanned, not just the first
    stream = io.BytesIO()
    pickle.dump(1, stream, protocol=2)
    pickle.dump(OrderedDict(), stream, protocol=2)
    stream.write(b"c__builtin__\nexec\n(S'1'\ntR.")
    assert ("builtins", "exec") in pickle_globals(_pickle_file(tmp_path, stream.getvalue()))


def test_check_checkpoint_missing_folder_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        check_checkpoint(tmp_path / "nope")


# --- model code: trust_remote_code only from an explicit flag -------------------------------

def _model_with_code(folder, marker) -> Path:
    """A model folder whose config maps the Auto classes to its own Python file; importing that file creates ``marker``."""
    import json

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "hfzero_custom", "architectures": ["CustomModel"],
        "auto_map": {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel",
                     "AutoModelForSequenceClassification": "custom.CustomModel",
                     "AutoTokenizer": ["custom.CustomTokenizer", None]}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CustomTokenizer", "auto_map": {"AutoTokenizer": ["custom.CustomTokenizer", None]}}))
    (folder / "custom.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from transformers import PretrainedConfig\n\n\nclass CustomConfig(PretrainedConfig):\n    model_type = 'hfzero_custom'\n")
    return folder


def _finetune_args(argv):
    from transformers import HfArgumentParser

    from hf_zero.finetune.args import FinetuneArguments

    [ft] = HfArgumentParser(FinetuneArguments).parse_args_into_dataclasses(args=argv)
    return ft


@pytest.mark.parametrize("loader", ["tokenizer", "model"])
def test_finetune_refuses_model_code_without_the_flag(tmp_path, monkeypatch, loader):
    from hf_zero.finetune.task import Task, load_model, load_tokenizer

    marker = tmp_path / "pwned"
    model = _model_with_code(tmp_path / "model", marker)
    # transformers' own default (None) asks on the terminal; a user answering "y" would run the code. hf_zero passes False.
    monkeypatch.setattr("builtins.input", lambda *a: "y")
    ft = _finetune_args(["--model", str(model), "--data", "d.csv"])
    assert ft.trust_remote_code is False
    with pytest.raises(ValueError, match="trust_remote_code"):
        if loader == "tokenizer":
            load_tokenizer(ft)
        else:
            load_model(ft, Task(None, None, None, None, {"id2label": {0: "a", 1: "b"}}))
    assert not marker.exists()


def test_finetune_flag_runs_model_code_and_plain_models_need_none(tmp_path, tiny_models):
    from transformers import AutoConfig

    marker = tmp_path / "pwned"
    model = _model_with_code(tmp_path / "model", marker)
    ft = _finetune_args(["--model", str(model), "--data", "d.csv", "--trust_remote_code"])
    AutoConfig.from_pretrained(ft.model, trust_remote_code=ft.trust_remote_code)  # what task.py passes
    assert marker.exists()
    # a model without code of its own loads with the default: the refusal stays quiet
    from hf_zero.finetune.task import Task, load_model

    ft = _finetune_args(["--model", str(tiny_models["llama"]), "--data", "d.csv", "--task", "causal_lm"])
    assert load_model(ft, Task(None, None, None, None, {})).config.model_type == "llama"


def test_plan_and_check_never_run_model_code(tmp_path, capsys):
    from hf_zero.cli import main

    marker = tmp_path / "pwned"
    model = _model_with_code(tmp_path / "model", marker)
    assert main(["plan", str(model), "--gpus", "1", "--gpu-mem", "80"]) == 2
    assert "custom code" in capsys.readouterr().err
    assert main(["check", "zero2", "--cpu", "--no-env", "--model", str(model)]) == 0  # reads config.json as data
    assert not marker.exists()


# --- the scan guards every entry point docs/security.md lists: resume, conversion, attach's partial scan ----

def _resume_target(output_dir, world_size):
    """What prepare_resume reads of a Trainer: its output_dir, world size and live DeepSpeed config (scanning
    happens before any of it is used, so no engine or process group is needed to reach the scan)."""
    from types import SimpleNamespace

    return SimpleNamespace(args=SimpleNamespace(output_dir=str(output_dir), world_size=world_size,
                                                hf_deepspeed_config=SimpleNamespace(config={})))


@pytest.mark.parametrize("world_size", [1, 2], ids=["same-world-size", "converted"])
def test_prepare_resume_refuses_a_bombed_checkpoint(checkpoints, tmp_path, world_size):
    from hf_zero import prepare_resume

    marker = tmp_path / "pwned"
    folder, bomb = bombed_copy(checkpoints["zero3"], tmp_path / "checkpoint-2", marker, "*optim_states.pt")
    with pytest.raises(UnsafeCheckpointError, match="io.open") as info:
        prepare_resume(_resume_target(tmp_path, world_size), folder)
    assert str(bomb) in str(info.value)
    assert not marker.exists() and not list(folder.glob("*_universal"))  # nothing loaded, nothing converted


def test_convert_to_universal_refuses_a_bombed_checkpoint(checkpoints, tmp_path):
    from hf_zero.checkpoints.resume import convert_to_universal

    marker = tmp_path / "pwned"
    folder, bomb = bombed_copy(checkpoints["zero2"], tmp_path / "checkpoint-2", marker, "*optim_states.pt")
    with pytest.raises(UnsafeCheckpointError, match="io.open"):
        convert_to_universal(folder)
    assert not marker.exists() and not list(folder.glob("*_universal"))


def test_attach_scan_of_the_output_dir_refuses_a_bombed_checkpoint(checkpoints, tmp_path):
    """attach() sets aside partial checkpoints with set_aside_partial: a complete one that would run code is
    refused there, before the Trainer's resume_from_checkpoint=True could pick it."""
    from hf_zero.checkpoints.folders import last_good_checkpoint, set_aside_partial

    marker = tmp_path / "pwned"
    bombed_copy(checkpoints["zero3"], tmp_path / "run" / "checkpoint-2", marker, "*optim_states.pt")
    with pytest.raises(UnsafeCheckpointError, match="io.open"):
        set_aside_partial(tmp_path / "run")
    with pytest.raises(UnsafeCheckpointError, match="io.open"):
        last_good_checkpoint(tmp_path / "run")
    assert not marker.exists() and (tmp_path / "run" / "checkpoint-2").is_dir()
    assert set_aside_partial(tmp_path / "run", trust=True) == []  # vouched for: complete, so left in place
