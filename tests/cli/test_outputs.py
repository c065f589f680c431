"""Every hf-zero command that writes refuses an output that is, contains or sits inside what it reads, and stdout
carries only the command's answer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_zero.cli import main
from hf_zero.config import preset_path
from hf_zero.config.accelerate_yaml import yaml_deepspeed_config

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(path.stem for path in (REPO / "recipes").glob("*.json"))
STORED_YAMLS = sorted((REPO / "recipes" / "accelerate").glob("*.yaml"))  # the launch-only ones


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes: equal before and after means nothing was written or deleted."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fake_checkpoint(folder: Path) -> Path:
    """A folder hf_zero recognizes as a checkpoint by its names (nothing here loads it)."""
    (folder / "global_step2").mkdir(parents=True)
    (folder / "global_step2" / "mp_rank_00_model_states.pt").write_bytes(b"not a real shard")
    (folder / "latest").write_text("global_step2")
    (folder / "trainer_state.json").write_text("{}")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return folder


# ---- export ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where, relation", [("same", "is the input"), ("parent", "contains the input"),
                                             ("inside", "lies inside the input")])
@pytest.mark.parametrize("overwrite", [False, True])
def test_export_refuses_an_output_that_overlaps_the_checkpoint(tmp_path, capsys, where, relation, overwrite):
    ckpt = fake_checkpoint(tmp_path / "run" / "checkpoint-2")
    out = {"same": ckpt, "parent": tmp_path / "run", "inside": ckpt / "exported"}[where]
    before = snapshot(tmp_path)
    assert main(["export", str(ckpt), str(out)] + (["--overwrite"] if overwrite else [])) == 2
    err = capsys.readouterr().err
    assert relation in err and "Fix:" in err and "--overwrite to replace" not in err, err
    assert snapshot(tmp_path) == before and not (ckpt / "exported").exists()


def test_export_overwrite_never_deletes_a_checkpoint(tmp_path, capsys):
    """OUT unrelated to the input, but a checkpoint itself (or a run folder holding one): --overwrite refuses it."""
    source = fake_checkpoint(tmp_path / "a" / "checkpoint-2")
    for out in (fake_checkpoint(tmp_path / "b" / "checkpoint-4"), tmp_path / "b"):
        before = snapshot(tmp_path / "b")
        assert main(["export", str(source), str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "never deletes a checkpoint" in err and "checkpoint-4" in err, err
        assert snapshot(tmp_path / "b") == before


def test_export_to_a_new_folder_beside_the_checkpoint_passes_the_path_check(tmp_path, capsys):
    # quiet: the path rule lets it through; the fake shard then stops it further on, as any truncated file does
    ckpt = fake_checkpoint(tmp_path / "run" / "checkpoint-2")
    assert main(["export", str(ckpt), str(tmp_path / "run" / "exported")]) == 2
    err = capsys.readouterr().err
    assert "input" not in err and "truncated or corrupt" in err


# ---- presets, check, plan, finetune --------------------------------------------------------------------------------
def test_presets_refuses_to_write_over_the_shipped_preset_or_twice_to_one_file(tmp_path, capsys):
    shipped = preset_path("zero3_nvme")
    before = shipped.read_bytes()
    try:
        assert main(["presets", "zero3_nvme", "--nvme-path", str(tmp_path), "--out", str(shipped)]) == 2
        assert "is the input" in capsys.readouterr().err and shipped.read_bytes() == before
    finally:
        shipped.write_bytes(before)  # where the check is missing, the checkout's preset is put back
    both = tmp_path / "both.yaml"
    assert main(["presets", "zero3", "--out", str(both), "--accelerate-config", str(both)]) == 2
    assert "the same file" in capsys.readouterr().err and not both.exists()


def test_check_fix_refuses_to_overwrite_the_config_it_checks(tmp_path, capsys):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_checkpointing": True}))
    before = config.read_bytes()
    assert main(["check", str(config), "--cpu", "--no-env", "--fix", str(config)]) == 2
    assert "--fix" in capsys.readouterr().err and config.read_bytes() == before
    assert main(["check", str(config), "--cpu", "--no-env", "--fix", str(tmp_path / "fixed.json")]) == 1  # quiet
    assert (tmp_path / "fixed.json").exists()


def test_plan_refuses_to_write_into_the_model_folder(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                                   "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "vocab_size": 256}))
    before = snapshot(model)
    assert main(["plan", str(model), "--gpus", "1", "--gpu-mem", "80", "--config", "zero2",
                 "--write", str(model / "config.json")]) == 2
    assert "lies inside the input" in capsys.readouterr().err and snapshot(model) == before
    assert main(["plan", str(model), "--gpus", "1", "--gpu-mem", "80", "--config", "zero2",
                 "--write", str(tmp_path / "ds.json")]) == 0  # quiet: beside the model folder
    assert json.loads((tmp_path / "ds.json").read_text())["zero_optimization"]


def test_finetune_refuses_an_output_dir_around_its_model(tiny_models, tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("text,label\na,0\nb,1\n")
    model = tmp_path / "run" / "model"
    model.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (model / name).write_bytes((tiny_models["bert"] / name).read_bytes())
    before = snapshot(tmp_path)
    assert main(["finetune", "--model", str(model), "--data", str(data), "--output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--output_dir" in err and "contains the input" in err and "Traceback" not in err
    assert snapshot(tmp_path) == before


# ---- stdout carries the answer alone --------------------------------------------------------------------------------
def _cli(*argv, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}  # as a user's shell has it
    return subprocess.run([sys.executable, "-m", "hf_zero", *map(str, argv)], capture_output=True, text=True, env=env,
                          cwd=cwd)


def test_stdout_is_only_the_answer(tmp_path):
    written = tmp_path / "z3.yaml"
    proc = _cli("presets", "zero3", "--accelerate-config", written)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{written.resolve()}\n"  # what $(hf-zero presets ...) hands to accelerate launch
    proc = _cli("presets", "zero2")
    assert proc.stdout == f"{preset_path('zero2')}\n", proc.stdout
    proc = _cli("check", "zero2", "--cpu", "--no-env", "--json")
    assert json.loads(proc.stdout) == [], proc.stdout


# ---- every preset's and every stored Accelerate YAML by name ---------------------------------------------------------
def test_presets_lists_and_writes_every_presets_accelerate_yaml(tmp_path, capsys):
    from accelerate.commands.config.config_args import load_config_from_file

    assert main(["presets"]) == 0
    listing = "\n" + capsys.readouterr().out
    for name in PRESETS:
        assert f"\n{name} " in listing, name
        copy = tmp_path / f"{name}.yaml"
        assert main(["presets", name, "--accelerate-config", str(copy)]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.strip() == str(copy.resolve())
        assert yaml_deepspeed_config(copy) == json.loads(preset_path(name).read_text())
        assert load_config_from_file(str(copy)).distributed_type == "DEEPSPEED"  # Accelerate's own reader


def test_presets_lists_and_writes_every_stored_accelerate_yaml(tmp_path, capsys):
    assert main(["presets"]) == 0
    listing = "\n" + capsys.readouterr().out
    for path in STORED_YAMLS:
        name = path.stem
        assert f"\n{name} " in listing, name
        assert main(["presets", name]) == 0, capsys.readouterr().err
        printed = Path(capsys.readouterr().out.strip())
        assert printed.exists() and printed.stem == name
        copy = tmp_path / f"{name}.yaml"
        assert main(["presets", name, "--accelerate-config", str(copy)]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.strip() == str(copy.resolve())
        # the copy is the stored YAML: the same launch settings and the same DeepSpeed config
        assert yaml_deepspeed_config(copy) == yaml_deepspeed_config(path)
        stored, written = yaml.safe_load(path.read_text()), yaml.safe_load(copy.read_text())
        stored["deepspeed_config"].pop("deepspeed_config_file")
        written["deepspeed_config"].pop("deepspeed_config_file")
        assert written == stored


def test_an_unknown_name_names_the_accelerate_yamls_too(capsys):
    assert main(["presets", "zero9"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'zero9'" in err and "zero3_multinode" in err


@pytest.mark.parametrize("flag, other_flag", [("--accelerate-config", "--out"), ("--out", "--accelerate-config")])
def test_a_path_that_cannot_be_written_is_one_message_with_a_fix_and_nothing_is_written(tmp_path, capsys, flag,
                                                                                         other_flag):
    target, other = tmp_path / "missing" / "zero3.yaml", tmp_path / "other.yaml"
    assert main(["presets", "zero3", flag, str(target), other_flag, str(other)]) == 2
    err = capsys.readouterr().err
    assert err == (f"hf-zero presets: error: {flag} {target}: the folder {target.parent} does not exist. Fix: create "
                   f"it first (mkdir -p {target.parent}), or name a file in an existing folder\n")
    # checked before anything is written: the other, good path stays unwritten too
    assert not other.exists() and not target.parent.exists()
    # the same command with the folder there writes both files
    target.parent.mkdir()
    assert main(["presets", "zero3", flag, str(target), other_flag, str(other)]) == 0
    assert target.is_file() and other.is_file()


def test_a_folder_or_a_file_in_the_way_is_named_with_a_fix(tmp_path, capsys):
    assert main(["presets", "zero3", "--accelerate-config", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"hf-zero presets: error: --accelerate-config {tmp_path} is a folder. Fix: name "
                                       f"a file in it, e.g. {tmp_path / 'zero3.yaml'}\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["presets", "zero3", "--out", str(blocker / "ds.json")]) == 2
    assert capsys.readouterr().err == (f"hf-zero presets: error: --out {blocker / 'ds.json'}: {blocker} is a file, not "
                                       "a folder. Fix: name a path whose folders exist\n")
