"""The benchmark harness (python -m benchmarks.harness) on CPU: the real CLI, real torchrun workers, real Trainer and DeepSpeed, a tiny model.

One sweep (ddp, zero3, and a variant that must fail) is shared by the multi-process tests; the
parsing, comparison and report checks run in-process, each where it fires and where it stays quiet.
"""

import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import TrainerState

from conftest import REPO, worker_env
from benchmarks.harness import report
from benchmarks.harness.run import (Options, _error_line, child_env, failure, measured_launches, merge_repeat,
                                planner_row, resolve_defaults, saves)
from benchmarks.harness.peak_memory import BEFORE, NO_FRAME, peak_breakdown
from benchmarks.harness.profile import self_time, subtract, summarize, union
from benchmarks.harness.setups import default_names, named_setups, parse_variant, select
from benchmarks.harness.worker import PadToLongest, RandomTokens, StepTimer, compare_weights, engine_problem, nvme_folders
from benchmarks.harness.cli import main
from hf_zero.errors import ConfigError

# A real crash inside one setup's workers (PyTorch's DataLoader rejects -1 workers), which the sweep
# must record with its error and survive.
BROKEN = "broken=ddp:args.dataloader_num_workers=-1"
LORA = "z3lora=zero3:lora.r=4,lora.lora_alpha=8"  # a PEFT LoRA adapter on the frozen, partitioned model
VARIABLE = "var=zero2:data.min_seq=16,data.pad_to_multiple_of=8"  # batches padded to their longest sample
ACCUMULATED = "acc=zero2:args.gradient_accumulation_steps=3"  # 3 micro-batches per optimizer step
SWEEP = ["--setups", "ddp,zero3", "--variant", BROKEN, "--variant", LORA, "--variant", VARIABLE, "--variant", ACCUMULATED,
         "--nproc", "2", "--steps", "5", "--warmup", "2", "--seq", "32",
         "--profile-steps", "1", "--memory-snapshot"]


def _bench(args, tmp_out, timeout=600):
    cmd = [sys.executable, "-m", "benchmarks.harness", "--out", str(tmp_out), *args]
    return subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = _bench(SWEEP, out)
    results = out / "results.json"
    if not results.exists():
        pytest.fail(f"no results.json; exit {proc.returncode}\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    return out, proc, json.loads(results.read_text())


def _row(data, name):
    return next(r for r in data["results"] if r["name"] == name)


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_sweep_measures_ddp_and_zero3(sweep):
    out, proc, data = sweep
    ddp, zero3 = _row(data, "ddp"), _row(data, "zero3")
    for row, engine in ((ddp, "DistributedDataParallel"), (zero3, "DeepSpeedEngine")):
        assert row["status"] == "ok", row
        assert row["engine"] == engine and row["world_size"] == 2
        assert row["tokens_per_s"] > 0 and row["tflops_per_gpu"] > 0
        assert len(row["step_times"]) == 5 and row["median_step_s"] > 0
        assert row["tokens_per_step"] == row["micro_batch"] * 32 * 2
        assert row["memory"]["kind"] == "rss" and len(row["memory"]["per_rank"]) == 2 and row["memory"]["peak_gib"] > 0
        assert row["planner"]["predicted_gib"] > 0 and "within_tolerance" not in row["planner"]  # CPU: not comparable
    assert zero3["partitioned"] and zero3["save"]["reload_equal"] and zero3["save"]["problems"] == []
    assert zero3["save"]["seconds"] > 0 and zero3["save"]["tensors"] > 0
    assert ddp["save"] is None  # only ZeRO-3 saves are timed
    assert data["model"]["params"] > 0 and data["model"]["flops_per_token"] > 0
    run = data["runs"][-1]
    assert run["versions"]["torch"] and run["versions"]["deepspeed"] and run["command"].startswith("python -m benchmarks.harness")
    assert "[1/6] ddp:" in proc.stdout and "[2/6] zero3:" in proc.stdout


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_lora_variant_trains_an_adapter_on_the_partitioned_base(sweep):
    _, _, data = sweep
    lora, zero3 = _row(data, "z3lora"), _row(data, "zero3")
    assert lora["status"] == "ok" and lora["engine"] == "DeepSpeedEngine" and lora["partitioned"], lora
    assert lora["setup"]["lora"] == {"r": 4, "lora_alpha": 8} and zero3["setup"]["lora"] == {}
    assert all(loss == loss for loss in lora["losses"])  # trained, no NaN
    assert lora["save"] is None  # the adapter's save is hf_zero.lora's, tested in test_lora.py
    # planned as LoRA on peft's default targets for Llama (q_proj, v_proj), not as full fine-tuning
    assert lora["planner"]["setup"] == "zero3" and lora["planner"]["predicted_gib"] > 0
    assert lora["planner"]["predicted_gib"] != zero3["planner"]["predicted_gib"]
    # no weight gradients for the frozen base: 4N instead of 6N per token
    assert lora["tflops_per_gpu"] / lora["tokens_per_s"] < zero3["tflops_per_gpu"] / zero3["tokens_per_s"]
    table_row = next(line for line in report.table(data).splitlines() if line.startswith("| z3lora |"))
    assert table_row.split(" | ")[4] == ""  # no % DDP: it trains an adapter, DDP the whole model
    assert "count 4N" in report.render_markdown(data)


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_variable_length_variant_counts_real_tokens(sweep):
    _, _, data = sweep
    var, full = _row(data, "var"), _row(data, "ddp")
    assert var["status"] == "ok" and var["engine"] == "DeepSpeedEngine", var
    stats = var["data"]
    assert 16 <= stats["mean_sample_tokens"] < 32 and 0 < stats["padding_share"] < 1
    assert all(w % 8 == 0 and w <= 32 for w in stats["batch_widths"])
    # real tokens only: fewer than the full batches of 4 x 32 tokens on 2 ranks
    assert var["tokens_per_step"] < full["tokens_per_step"] == 4 * 32 * 2
    assert var["tflops_per_gpu"] > 0 and "data" not in full
    assert "`var`: samples of 16..32 tokens" in report.render_markdown(data)


@pytest.mark.multiproc
@pytest.mark.long
def test_accumulation_counts_every_micro_batch_of_an_optimizer_step(sweep):
    _, _, data = sweep
    acc, plain = _row(data, "acc"), _row(data, "ddp")
    assert acc["status"] == "ok" and acc["gradient_accumulation_steps"] == 3, acc
    assert acc["tokens_per_step"] == 3 * plain["tokens_per_step"] == 3 * 4 * 32 * 2
    assert len(acc["step_times"]) == 5  # optimizer steps, each of 3 micro-batches: the dataset held all of them
    assert acc["host_memory"]["peak_rss_gib"] > 0 and acc["host_memory"]["peak_pinned_gib"] is None  # no GPU here
    assert plain["gradient_accumulation_steps"] == 1
    assert f"| acc | {3 * 4 * 32 * 2:,} | 3 |" in report.render_markdown(data)


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_crashing_setup_is_recorded_and_the_sweep_goes_on(sweep):
    out, proc, data = sweep
    assert proc.returncode == 1, proc.stderr[-3000:]  # a failed setup: results written, exit 1
    broken = _row(data, "broken")
    assert broken["status"] == "failed"
    assert "num_workers" in broken["error"] and "Error" in broken["error"], broken["error"]
    assert (out / broken["log"]).exists() and broken["log_tail"]
    assert "[3/6] broken: FAILED" in proc.stdout
    assert [r["name"] for r in data["results"]] == ["ddp", "zero3", "broken", "z3lora", "var", "acc"]


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_sweep_writes_table_and_chart(sweep, tmp_path):
    out, _, data = sweep
    md = (out / "results.md").read_text()
    assert "| zero3 | 4 |" in md and "| ddp | 4 |" in md and "failed: " in md
    assert "CPU run" in md and "bitwise equal" in md
    assert data["runs"][-1]["command"] in md
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] > 100
    # --report re-renders from the JSON alone, next to it
    copy = tmp_path / "results.json"
    shutil.copy(out / "results.json", copy)
    assert main(["--report", str(copy)]) == 0
    assert (tmp_path / "results.md").read_text() == md and (tmp_path / "bench.png").exists()


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_profiled_step_shows_whose_code_ran(sweep):
    out, _, data = sweep
    ddp, zero3 = _row(data, "ddp"), _row(data, "zero3")
    for row in (ddp, zero3):
        profile = row["profile"]
        assert profile["steps"] == 1 and profile["step_ms"] > 0
        # the training thread's step is split among owners, nothing lost and nothing counted twice
        assert sum(profile["cpu_self_ms"].values()) == pytest.approx(profile["python_traced_step_ms"], rel=1e-6)
        for suffix in (".json.gz", ".python.json.gz"):
            assert (out / "traces" / f"{row['name']}{suffix}").stat().st_size > 1000
        assert len(row["step_times"]) == 5  # the profiled steps are not timed, nor the recorded one
        assert row["memory_breakdown"] == {"note": "CUDA only: torch records the allocator's history on GPUs"}
    # ZeRO-3's hooks are DeepSpeed Python; DDP runs none of it
    assert zero3["profile"]["cpu_self_ms"]["deepspeed"] > 1.0
    assert ddp["profile"]["cpu_self_ms"].get("deepspeed", 0.0) == 0.0
    assert "Where a step's time goes" in (out / "results.md").read_text()
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.multiproc
@pytest.mark.long  # one CPU sweep of 6 setups (~2 min); make test-long
def test_resume_merges_and_another_shape_is_refused(sweep, tmp_path, capsys):
    out, _, data = sweep
    merged = tmp_path / "merged"
    shutil.copytree(out, merged)
    # everything asked for is measured already: nothing launches, the run is recorded, the rows stay
    assert main(["--out", str(merged), "--resume", *SWEEP[:2], *SWEEP[4:]]) == 0
    assert "already measured, skipped (--resume)" in capsys.readouterr().out
    again = json.loads((merged / "results.json").read_text())
    assert len(again["runs"]) == 2 and again["results"] == data["results"]
    # a different sequence length would mix incomparable numbers into one table
    assert main(["--out", str(merged), "--setups", "ddp", "--nproc", "2", "--seq", "16"]) == 2
    assert "holds results of another run" in capsys.readouterr().err


@pytest.mark.multiproc
@pytest.mark.long  # 5 tiny launches (~40 s); make test-long
def test_repeat_interleaves_launches_and_resume_continues_them(tmp_path):
    # d2 also passes a torchrun option (one that changes nothing here): it must reach the launch
    args = ["--setups", "ddp", "--variant", "d2=ddp:mbs=2,torchrun.max-restarts=0", "--nproc", "2", "--steps", "3",
            "--warmup", "1", "--seq", "16"]
    proc = _bench([*args, "--repeat", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launched = (tmp_path / "logs" / "d2.log").read_text().splitlines()[0]
    assert " --max-restarts=0 -m benchmarks.harness.worker" in launched, launched
    order = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("[")]
    assert order == ["[1/2] round 1/2 ddp", "[2/2] round 1/2 d2", "[1/2] round 2/2 ddp", "[2/2] round 2/2 d2"]
    row = _row(json.loads((tmp_path / "results.json").read_text()), "ddp")
    assert len(row["repeat_tokens_per_s"]) == 2 and row["tokens_per_s"] == pytest.approx(sum(row["repeat_tokens_per_s"]) / 2)
    assert " (n=2)" in (tmp_path / "results.md").read_text()
    # a third round later: the two measured rounds are kept and skipped, the third joins them
    proc = _bench([*args, "--repeat", "3", "--resume"], tmp_path)
    assert proc.returncode == 0 and proc.stdout.count("already measured, skipped (--resume)") == 4, proc.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    assert [len(_row(data, n)["repeat_tokens_per_s"]) for n in ("ddp", "d2")] == [3, 3]


def test_repeats_merge_into_one_row_only_within_a_sweep():
    first = {"tokens_per_s": 100.0, "memory": {"peak_gib": 2.0}, "status": "ok"}
    second = {"tokens_per_s": 140.0, "memory": {"peak_gib": 1.5}, "status": "ok"}
    merged = merge_repeat(first, second)
    assert merged["repeat_tokens_per_s"] == [100.0, 140.0] and merged["tokens_per_s"] == 120.0
    assert merged["tokens_per_s_spread"] == pytest.approx(40 / 120) and merged["memory"]["peak_gib"] == 2.0
    third = merge_repeat(merged, {"tokens_per_s": 90.0, "memory": {"peak_gib": 2.5}, "status": "ok"})
    assert third["tokens_per_s"] == 100.0 and third["memory"]["peak_gib"] == 2.5 and measured_launches(third) == 3
    assert measured_launches(first) == 1 and measured_launches(None) == 0
    assert measured_launches({"status": "failed"}) == 0
    with pytest.raises(ConfigError, match="--repeat must be at least 1"):
        resolve_defaults(Options(repeat=0), gpus=0)


def test_unknown_setup_is_one_message_and_exit_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "o"), "--setups", "ddp,zero9,fsdp_fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("benchmarks.harness: error: unknown setup(s) 'zero9', 'fsdp_fast'") and "ds_auto_zero3" in err
    assert "Traceback" not in err and not (tmp_path / "o" / "results.json").exists()
    assert main(["--out", str(tmp_path / "o"), "--setups", "ddp", "--list"]) == 0  # a known name: quiet
    assert capsys.readouterr().out.startswith("ddp: ddp, micro batch 4")


@pytest.mark.multiproc
def test_hung_setup_is_killed_at_the_timeout(tmp_path, capsys):
    # 2 s is far less than a launch needs to import torch: the timeout fires, and every rank goes with it
    assert main(["--out", str(tmp_path), "--setups", "ddp", "--nproc", "1", "--setup-timeout", "2"]) == 1
    row = json.loads((tmp_path / "results.json").read_text())["results"][0]
    assert row["status"] == "timeout" and "--setup-timeout" in row["error"] and row["wall_s"] < 30
    assert "[1/1] ddp: TIMEOUT" in capsys.readouterr().out
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert left == "", f"ranks left running: {left}"


def test_bad_deepspeed_variant_stops_before_any_launch(tmp_path, capsys):
    code = main(["--out", str(tmp_path), "--variant", "z=zero2:zero_optimization.offload_optimizer.device=gpu"])
    assert code == 2
    assert "z: " in capsys.readouterr().err and not (tmp_path / "results.json").exists()


def test_steps_must_exceed_warmup():
    with pytest.raises(ConfigError, match="no timed step"):
        resolve_defaults(Options(steps=3, warmup=3), gpus=0)
    assert resolve_defaults(Options(steps=4, warmup=3), gpus=0).model == "tiny"  # CPU defaults


def test_named_setups_and_groups():
    names = named_setups()
    assert len(names) == 20 and names["zero2+gc"].micro_batch == 8 and names["zero2+gc"].gradient_checkpointing
    assert names["zero3_nvme"].planner_setup == "zero3_nvme" and "zero3_nvme" not in default_names(2)
    assert names["ds_auto_zero3"].deepspeed["zero_optimization"]["reduce_bucket_size"] == "auto"
    assert names["ds_auto_zero2"].deepspeed["scheduler"]["type"] == "WarmupLR"
    assert names["zero3"].deepspeed["zero_optimization"]["reduce_bucket_size"] == 500_000_000  # the shipped preset
    # the groups leave zero3_nvme out: it measures the disk under the work folder
    assert [s.name for s in select(["gc"], [], 2)] == [n for n in names if n.endswith("+gc") and "nvme" not in n]
    assert [s.name for s in select(["zero3_nvme"], [], 1)] == ["zero3_nvme"]
    assert "fsdp" in default_names(2) and "fsdp" not in default_names(1)
    assert [s.name for s in select(None, ["v=zero3"], 2)] == ["v"]  # variants alone unless --setups adds more


def test_zero3_setups_save_by_default_and_every_setup_with_save_all():
    names = named_setups()
    assert saves(names["zero3"], Options()) and saves(names["zero3_nvme"], Options())
    assert not saves(names["zero2_offload"], Options()) and not saves(names["ddp"], Options())
    assert saves(names["zero2_offload"], Options(save_all=True)) and saves(names["ddp"], Options(save_all=True))
    lora = parse_variant("l=zero3:lora.r=4", names)
    assert not saves(lora, Options()) and not saves(lora, Options(save_all=True))


@pytest.mark.multiproc
@pytest.mark.long
def test_save_all_saves_and_reloads_a_zero2_run(tmp_path):
    proc = _bench(["--setups", "zero2", "--save-all", "--nproc", "1", "--steps", "2", "--warmup", "1", "--seq", "16"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "results.json").read_text())["results"]
    assert row["save"]["reload_equal"] and row["save"]["tensors"] > 0, row["save"]


def test_nvme_folders_are_where_the_resolved_config_swaps(tmp_path):
    from hf_zero.config.presets import load_config

    config = load_config("zero3_nvme", nvme_path=tmp_path / "work")
    config["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(tmp_path / "mine")  # a user's own folder
    assert nvme_folders(config) == {tmp_path / "work", tmp_path / "mine"}
    assert nvme_folders(load_config("zero3_offload")) == set() and nvme_folders(None) == set()


def test_variant_parsing():
    known = named_setups()
    v = parse_variant("z3=zero3+gc:zero_optimization.reduce_bucket_size=1e9,zero_optimization.stage3_max_live_parameters=null,"
                      "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128,mbs=2,args.optim=adamw_torch", known)
    zero = v.deepspeed["zero_optimization"]
    assert zero["reduce_bucket_size"] == 1_000_000_000 and isinstance(zero["reduce_bucket_size"], int)
    assert "stage3_max_live_parameters" not in zero
    assert v.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"}
    assert v.micro_batch == 2 and v.gradient_checkpointing and v.args == {"optim": "adamw_torch"}
    assert known["zero3+gc"].deepspeed["zero_optimization"]["reduce_bucket_size"] == 500_000_000  # base untouched
    with pytest.raises(ConfigError) as e:
        parse_variant("d=ddp:mbs=0,zero_optimization.stage=2,oops", known)
    assert len(e.value.problems) == 2
    assert parse_variant("z=zero3:optimizer.params.betas=[0.9,0.95]", known).deepspeed["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert parse_variant("n=fsdp:torchrun.numa-binding=node", known).torchrun == {"numa-binding": "node"}
    assert parse_variant("c=zero3:dynamo.recompile_limit=64", known).dynamo == {"recompile_limit": 64}
    assert parse_variant("l=zero3:lora.r=16,lora.target_modules=[\"q_proj\"]", known).lora == {"r": 16, "target_modules": ["q_proj"]}
    assert parse_variant("l=fsdp:lora.r=8", known).lora == {"r": 8}  # not a DeepSpeed key: any base takes it
    assert parse_variant("v=fsdp:data.min_seq=256,data.pad_to_multiple_of=64", known).data == {
        "min_seq": 256, "pad_to_multiple_of": 64}
    assert known["fsdp"].data == {}
    assert parse_variant("f=zero3:lora.r=8,callback.cast_adapters=false", known).callback == {"cast_adapters": False}
    assert parse_variant("f=zero3:callback.offload_threads=0", known).callback == {"offload_threads": 0}
    assert parse_variant("f=zero2:callback.offload_step_chunk=8192", known).callback == {"offload_step_chunk": 8192}
    assert known["zero3"].callback == {}
    for bad, words in (("noequals", "NAME=BASE"), ("x=zero7", "unknown base"), ("zero2=zero3", "already a setup"),
                       ("a/b=zero3", "may only use"), ("z=zero3:zero_optimization.stage=3,oops", "comma inside"),
                       ("z=zero3:=5", "not key=value"), ("n=ddp:torchrun.numa-binding=close", "invalid choice"),
                       ("n=ddp:torchrun.numa-bind=node", "no option --numa-bind"),
                       ("n=ddp:torchrun.master-port=1", "the harness sets it"),
                       ("c=zero3:dynamo.recompile_limt=64", "no setting 'recompile_limt'"),
                       ("l=zero3:lora.rank=8", "LoraConfig has no field 'rank'"), ("l=zero3:lora.task_type=SEQ_CLS", "CAUSAL_LM"),
                       ("v=zero3:data.min_len=8", "data.min_len: unknown"), ("v=zero3:data.min_seq=0", "positive integer"),
                       ("v=zero3:data.pad_to_multiple_of=8", "give data.min_seq too"),
                       ("f=zero3:callback.cast=false", "ZeroCallback has no option 'cast'"),
                       ("f=zero3:callback.log_memory=true", "no option 'log_memory'"),
                       ("f=zero3:callback.cast_adapters=2", "true or false"),
                       ("f=zero3:callback.offload_threads=-1", "auto or a thread count"),
                       ("f=zero3:callback.offload_threads=many", "auto or a thread count"),
                       ("f=zero2:callback.offload_step_chunk=100", "multiple of 4,096"),
                       ("f=fsdp:callback.cast_adapters=false", "not a DeepSpeed setup")):
        with pytest.raises(ConfigError, match=words):
            parse_variant(bad, known)


def test_variable_length_batches_are_padded_to_their_longest_sample_and_counted():
    data = RandomTokens(vocab=50, seq=32, length=8, pool=8, min_seq=5)
    lengths = [len(data[i]["input_ids"]) for i in range(8)]
    assert min(lengths) >= 5 and max(lengths) <= 32 and len(set(lengths)) > 1
    assert [len(data[i]["input_ids"]) for i in range(8)] == lengths  # the same lengths on every rank and launch
    assert {len(RandomTokens(50, 32, 4, pool=4)[i]["input_ids"]) for i in range(4)} == {32}  # quiet: full length

    collate = PadToLongest(multiple=8)
    batch = collate([data[0], data[1]])
    width = -(-max(lengths[:2]) // 8) * 8
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (2, width)
    assert batch["attention_mask"].sum().item() == sum(lengths[:2]) == sum(collate.sample_lengths[0])
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()  # padding is never a target
    assert collate.widths == [width] and collate.sample_lengths == [lengths[:2]]
    assert PadToLongest()([data[0], data[1]])["input_ids"].shape[1] == max(lengths[:2])


def test_variable_length_rows_are_described_and_not_compared_with_full_batches():
    rows = [{"name": "zero3", "status": "ok", "gradient_checkpointing": False, "setup": {}},
            {"name": "v", "status": "ok", "gradient_checkpointing": False, "setup": {"data": {"min_seq": 256}},
             "data": {"min_seq": 256, "mean_sample_tokens": 640.2, "padding_share": 0.21, "batch_widths": [700, 1024]},
             "compiled_graphs": 3}]
    by_name = {r["name"]: r for r in rows}
    assert report.reference(by_name, rows[1], "zero3") is None
    assert report.reference(by_name, rows[0], "zero3") is rows[0]
    (line,) = [ln for ln in report.data_lines(rows, 1024) if ln.startswith("- ")]
    assert "`v`: samples of 256..1024 tokens (mean 640)" in line and "21%" in line and "3 graphs compiled" in line
    assert report.data_lines(rows[:1], 1024) == []


def _span(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_profile_counts_exposed_communication():
    # one 100 us step: compute 0-40 and 60-80, NCCL 30-70 (hidden 30-40 and 60-70, exposed 40-60), idle 80-100
    events = [_span("user_annotation", "ProfilerStep#9", 0, 100), _span("cpu_op", "aten::mm", 0, 5),
              _span("kernel", "sm90_gemm", 0, 40, tid=7), _span("kernel", "flash_fwd", 60, 20, tid=7),
              _span("kernel", "ncclDevKernel_AllGather_RING", 30, 40, tid=20)]
    p = summarize(events, steps=1)
    assert p["step_ms"] == pytest.approx(0.1) and p["compute_ms"] == pytest.approx(0.06)
    assert p["comm_ms"] == pytest.approx(0.04) and p["exposed_comm_ms"] == pytest.approx(0.02)
    assert p["idle_ms"] == pytest.approx(0.02)
    assert p["top_kernels"][0]["name"] == "sm90_gemm" and p["top_kernels"][1]["communication"]
    # the same communication fully under compute is not exposed
    hidden = [e for e in events if "nccl" not in e["name"]] + [_span("kernel", "ncclDevKernel_AllGather", 5, 30, tid=20)]
    assert summarize(hidden, steps=1)["exposed_comm_ms"] == 0.0
    assert p["copies"] == {}


def test_profile_splits_copies_by_direction_and_host_memory_kind():
    # two steps: a pinned gradient copy-out per step, and one pageable upload (an offload buffer that lost its pinning)
    def copy(name, ts, dur, size):
        return {**_span("gpu_memcpy", name, ts, dur, tid=9), "args": {"bytes": size}}

    events = [_span("user_annotation", "ProfilerStep#1", 0, 100), _span("user_annotation", "ProfilerStep#2", 100, 100),
              copy("Memcpy DtoH (Device -> Pinned)", 10, 20, 2**30), copy("Memcpy DtoH (Device -> Pinned)", 110, 20, 2**30),
              copy("Memcpy HtoD (Pageable -> Device)", 150, 40, 2**31)]
    copies = summarize(events, steps=2)["copies"]
    assert copies == {"Memcpy DtoH (Device -> Pinned)": {"ms_per_step": pytest.approx(0.02), "gib_per_step": 1.0},
                      "Memcpy HtoD (Pageable -> Device)": {"ms_per_step": pytest.approx(0.02), "gib_per_step": 1.0}}


def test_peak_breakdown_names_who_allocated_what_was_alive_at_the_peak():
    ds = [{"filename": "/v/lib/python3.12/site-packages/deepspeed/runtime/zero/stage3.py", "line": 9, "name": "reduce"}]
    llama = [{"filename": "/v/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
             {"filename": "/v/site-packages/transformers/models/llama/modeling_llama.py", "line": 7, "name": "forward"}]
    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": ds},
             {"action": "alloc", "addr": 2, "size": 50, "frames": llama},
             {"action": "free_requested", "addr": 9, "size": 30},  # a block from before: gone only when completed
             {"action": "free_completed", "addr": 9, "size": 30},
             {"action": "alloc", "addr": 3, "size": 200, "frames": []},  # the peak: 1000 + 100 + 50 - 30 + 200
             {"action": "free_completed", "addr": 3, "size": 200},
             {"action": "alloc", "addr": 4, "size": 10, "frames": ds}]
    result = peak_breakdown(trace, before=1000)
    assert result["peak_bytes"] == 1320
    assert [(r["owner"], r["bytes"]) for r in result["rows"]] == [
        (BEFORE, 970), (NO_FRAME, 200), ("deepspeed/runtime/zero/stage3.py:9 (reduce)", 100),
        ("transformers/models/llama/modeling_llama.py:7 (forward)", 50)]
    assert sum(r["bytes"] for r in result["rows"]) == result["peak_bytes"]
    md = report.memory_breakdown_table({"results": [{"name": "zero3", "status": "ok", "memory_breakdown": result}]})
    assert "modeling_llama.py:7 (forward)" in md and "| zero3 | **peak of the recorded step** |" in md


def test_self_time_goes_to_the_innermost_frame():
    events = [_span("user_annotation", "ProfilerStep#3", 0, 100),
              _span("python_function", "transformers/trainer.py(1): training_step", 0, 100),
              _span("python_function", "deepspeed/runtime/zero/parameter_offload.py(9): _pre_forward_hook", 10, 50),
              _span("python_function", "<built-in function isinstance>", 15, 5),  # the hook's own time
              _span("cpu_op", "aten::copy_", 30, 10)]
    own = self_time(events, (0, 100))
    assert own == {"transformers": pytest.approx(50), "deepspeed": pytest.approx(40), "torch ops": pytest.approx(10)}
    assert subtract(union([(0, 10), (20, 30)]), union([(5, 25)])) == [[0, 5], [25, 30]]


def test_compare_weights_fires_on_any_difference():
    expected = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "b": torch.ones(3)}
    assert compare_weights({k: v.clone() for k, v in expected.items()}, expected) == []
    changed = {"a": expected["a"].clone(), "b": expected["b"].clone()}
    changed["b"][1] = 1.0000001
    assert compare_weights(changed, expected)[0].startswith("b: max abs diff")
    problems = compare_weights({"a": expected["a"].float()}, expected)
    assert any("b: missing" in p for p in problems) and any("a: saved torch.float32" in p for p in problems)


def test_engine_problem():
    assert engine_problem("deepspeed", "DeepSpeedEngine", 2) is None
    assert engine_problem("ddp", "DistributedDataParallel", 2) is None and engine_problem("ddp", "LlamaForCausalLM", 1) is None
    assert engine_problem("fsdp", "FSDPLlamaForCausalLM", 2) is None
    assert "not a DeepSpeedEngine" in engine_problem("deepspeed", "DistributedDataParallel", 2)
    assert "not FSDP" in engine_problem("fsdp", "DistributedDataParallel", 2)
    assert "not DistributedDataParallel" in engine_problem("ddp", "LlamaForCausalLM", 2)


def test_child_env_fixes_cuda_arch_suffix(monkeypatch):
    setup = named_setups()["zero2"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    env, changed = child_env(setup, on_gpu=True, nproc=2)
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0" and changed["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    assert "ACCELERATE_USE_CPU" not in env  # the caller's launcher leftovers never reach the workers
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    env, changed = child_env(setup, on_gpu=True, nproc=2)
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0" and "TORCH_CUDA_ARCH_LIST" not in changed


def test_error_line_skips_the_launcher_wrapper():
    log = ("[rank0]: Traceback (most recent call last):\n[rank0]:     raise RuntimeError(problem)\n"
           "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert _error_line(log).startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert _error_line("just a last line\n") == "just a last line"


def test_a_setup_killed_mid_run_keeps_the_steps_it_finished(capsys):
    # the worker's progress lines are what the launcher reads back from a log whose worker never wrote a result
    timer = StepTimer(started=time.perf_counter())
    state = TrainerState(max_steps=3)
    timer.on_train_begin(None, state, None)
    for step in (1, 2):
        state.global_step = step
        timer.on_step_end(None, state, None)
    log = capsys.readouterr().err
    assert "bench: model and engine ready after" in log and "bench: step 2/3:" in log
    row = failure("$ torchrun ...\n" + log + "Received 15 death signal\n", None, 400)
    assert row["status"] == "timeout" and row["finished_step_times"] == pytest.approx(timer.times, abs=0.01)
    assert "finished_step_times" not in failure("RuntimeError: boom\n", 1, 400)


def test_only_rank_zero_reports_progress(capsys):
    timer = StepTimer(started=time.perf_counter())
    state = TrainerState(max_steps=3, is_world_process_zero=False)
    timer.on_train_begin(None, state, None)
    timer.on_step_end(None, state, None)
    assert capsys.readouterr().err == "" and len(timer.times) == 1


def _gpu_row(name, tokens, peak, gc=False, **extra):
    base = name.removesuffix("+gc")
    return {"name": name, "base": base, "kind": "ddp" if base == "ddp" else "fsdp" if base == "fsdp" else "deepspeed",
            "micro_batch": 8 if gc else 4, "gradient_checkpointing": gc, "status": "ok", "tokens_per_s": tokens,
            "tflops_per_gpu": 1.0, "memory": {"kind": "cuda", "peak_gib": peak, "peak_reserved_gib": peak + 1}, **extra}


def _gpu_data(zero2_tokens, zero2_peak, save_seconds=4.0, reload_equal=True, planner_error=0.05):
    planner = {"predicted_gib": 20.0, "measured_gib": 21.0, "error": planner_error, "within_tolerance": abs(planner_error) <= 0.15}
    save = {"seconds": save_seconds, "bytes": 2.69e9, "reload_equal": reload_equal,
            "problems": [] if reload_equal else ["model.norm.weight: max abs diff 0.5"]}
    rows = [_gpu_row("ddp", 53400, 34.8), _gpu_row("fsdp", 38400, 17.9),
            _gpu_row("zero2", zero2_tokens, zero2_peak, planner=planner),
            _gpu_row("zero3", 40000, 19.0, save=save)]
    return {"model": {"name": "1.35b", "params": 1.35e9}, "fingerprint": {"nproc": 2, "seq": 1024, "steps": 20, "warmup": 5},
            "device": {"type": "cuda", "name": "NVIDIA H200"}, "results": rows, "runs": []}


def _targets(data):
    return {t.split(" ")[0]: (status, detail) for t, status, detail in report.evaluate_targets(data)}


def test_targets_pass_and_fail():
    good = _targets(_gpu_data(zero2_tokens=51000, zero2_peak=20.7))
    assert good["zero2"][0] == "PASS" and good["zero3"][0] == "PASS" and good["zero3:"][0] == "PASS"
    assert good["planner"][0] == "PASS" and good["zero2+gc"][0] == "n/a"
    slow = _targets(_gpu_data(zero2_tokens=30900, zero2_peak=20.2))  # the HF "auto" buckets' speed
    assert slow["zero2"] == ("FAIL", "speed 58%, memory 58%")
    big = _targets(_gpu_data(zero2_tokens=51000, zero2_peak=30.0, save_seconds=5.2, reload_equal=False, planner_error=-0.2))
    assert big["zero2"][0] == "FAIL" and big["zero3:"][0] == "FAIL" and "DIFFERS" in big["zero3:"][1]
    assert big["planner"][0] == "FAIL" and "zero2 -20%" in big["planner"][1]
    md = report.render_markdown(_gpu_data(zero2_tokens=51000, zero2_peak=20.7))
    assert "| zero2 | 4 |  | 51,000 | 96% | 133% |" in md and "CPU run" not in md
    repeated = _gpu_data(zero2_tokens=51000, zero2_peak=20.7)
    for row, spread in zip(repeated["results"][:3], (0.02, 0.0, 0.14)):  # ddp ±1%, fsdp, zero2 ±7%
        row["tokens_per_s_spread"] = spread
    assert _targets(repeated)["zero2"][1] == "speed 96%, memory 59%; launches vary ±7% / ±1%, more than the distance to the target"
    assert _targets(repeated)["zero3"][1] == "speed 104%, memory 106%"  # neither zero3 nor fsdp was repeated
    far = _gpu_data(zero2_tokens=30900, zero2_peak=20.2)
    far["results"][2]["tokens_per_s_spread"] = 0.14
    assert _targets(far)["zero2"] == ("FAIL", "speed 58%, memory 58%; launches vary ±7% / ±0%")  # clear of the target
    one_gpu = _gpu_data(zero2_tokens=51000, zero2_peak=20.7)
    one_gpu["fingerprint"]["nproc"] = 1
    alone = _targets(one_gpu)
    assert alone["zero2"] == ("n/a", "set for 2 GPUs; this run used 1") and alone["zero3:"][0] == "PASS"


def test_loss_target_names_setups_that_train_differently_from_ddp():
    data = _gpu_data(zero2_tokens=51000, zero2_peak=20.7)
    assert _targets(data)["every"] == ("n/a", "no setup with a DDP row and logged losses")
    for row, loss in zip(data["results"], (9.8266, 9.8297, 9.8283, 9.8598)):  # ddp, fsdp, zero2, zero3 with leaves
        row["losses"] = [loss]
    assert _targets(data)["every"] == ("FAIL", "2/3 within; off: zero3 +0.033")
    data["results"][3]["losses"] = [9.8296]
    assert _targets(data)["every"] == ("PASS", "3/3 within")
    # a DeepSpeed scheduler (the HF docs' "auto" configs) trains on another schedule: not compared
    data["results"].append(_gpu_row("ds_auto_zero3", 11534, 22.2, losses=[9.7954],
                                    setup={"deepspeed": {"scheduler": {"type": "WarmupLR"}}}))
    assert _targets(data)["every"] == ("PASS", "3/3 within")
    assert "| every setup trains as DDP does: mean loss within 0.02 of DDP's | PASS | 3/3 within |" in \
        report.render_markdown(data)


def test_environment_line_names_the_rows_a_variant_env_belongs_to():
    data = _gpu_data(zero2_tokens=51000, zero2_peak=20.7)
    for row in data["results"]:
        row["env_changed"] = {"OMP_NUM_THREADS": "16"}
    data["results"][2]["env_changed"]["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "true"
    md = report.render_markdown(data)
    assert "for every setup's workers: `OMP_NUM_THREADS=16`." in md
    assert "- `zero2`: `ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true`" in md
    assert md.count("REGIONAL_COMPILATION") == 1  # not in the line that speaks for every setup
    quiet = _gpu_data(zero2_tokens=51000, zero2_peak=20.7)  # no env changes: no environment line at all
    assert "Environment" not in report.render_markdown(quiet)


def test_planner_row_compares_only_gpu_memory():
    from hf_zero.model_configs import build_config, resolve_model
    from hf_zero.planner import ModelShape

    shape = ModelShape.from_config(build_config(resolve_model("tiny")[1]))
    opts = Options(nproc=2, seq=32)
    setups = named_setups()
    predicted = planner_row(setups["zero2"], shape, opts, {})["predicted_gib"]
    near = planner_row(setups["zero2"], shape, opts, {"memory": {"kind": "cuda", "peak_gib": predicted * 1.1}})
    far = planner_row(setups["zero2"], shape, opts, {"memory": {"kind": "cuda", "peak_gib": predicted * 1.3}})
    assert near["within_tolerance"] and not far["within_tolerance"]
    rss = {"memory": {"kind": "rss", "peak_gib": 0.5}}
    assert "not comparable" in planner_row(setups["zero2"], shape, opts, rss)["note"]
    assert planner_row(setups["fsdp"], shape, opts, {})["setup"] is None
    auto = planner_row(setups["ds_auto_zero2"], shape, opts, {})
    assert auto["bucket"] == shape.hidden ** 2  # "auto" buckets as the Trainer fills them
    # a LoRA row is planned in the dtype the worker saw the engine train the adapter in; rows measured before
    # it was recorded had fp32 adapters under ZeRO-3 (each adapted layer's input kept again in fp32)
    lora = parse_variant("l=zero3:lora.r=4", setups)
    bf16, fp32 = ({"adapter_dtypes": [f"torch.{t}"]} for t in ("bfloat16", "float32"))
    assert planner_row(lora, shape, opts, bf16)["predicted_gib"] < planner_row(lora, shape, opts, fp32)["predicted_gib"]
    assert planner_row(lora, shape, opts, {})["predicted_gib"] == planner_row(lora, shape, opts, fp32)["predicted_gib"]


def test_replan_recomputes_the_planner_column_with_the_installed_planner(tmp_path, capsys):
    results = tmp_path / "results.json"
    data = json.loads((REPO / "benchmarks/1xH200/results.json").read_text())
    row = _row(data, "zero3_offload")
    row["planner"] = {"setup": "zero3_offload", "predicted_gib": 16.34, "measured_gib": 13.06, "error": 0.25,
                      "within_tolerance": False}  # what the planner said before its offload recalibration
    results.write_text(json.dumps(data))
    assert main(["--report", str(results)]) == 0  # quiet: a plain re-render keeps the stored predictions
    assert "| planner predicts each measured peak within +-15% | FAIL |" in (tmp_path / "results.md").read_text()
    assert main(["--report", str(results), "--replan"]) == 0
    replanned = _row(json.loads(results.read_text()), "zero3_offload")["planner"]
    assert replanned["within_tolerance"] and abs(replanned["error"]) < 0.15
    md = (tmp_path / "results.md").read_text()
    assert "| planner predicts each measured peak within +-15% | PASS |" in md and "was recomputed on" in md
    assert main(["--replan"]) == 2 and "pass it with --report" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--setup-timeout", "0"], "--setup-timeout must be a positive number, got 0"),
    (["--setup-timeout", "nan"], "--setup-timeout must be a positive number"),
    (["--max-minutes", "-1"], "--max-minutes must be a positive number, got -1"),
    (["--nproc", "0"], "--nproc must be a positive integer, got 0"),
    (["--steps", "-1"], "--steps must be a positive integer, got -1"),
    (["--seq", "0"], "--seq must be a positive integer, got 0"),
    (["--warmup", "-1"], "--warmup must be 0 or more, got -1"),
    (["--profile-steps", "-2"], "--profile-steps must be 0 (off) or more, got -2"),
])
def test_bench_refuses_numbers_out_of_range(tmp_path, capsys, flags, message):
    assert main(["--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def _offload_row(name, base, tokens_per_step, tokens, **setup):
    from hf_zero.config.presets import load_config

    kind = "ddp" if base == "ddp" else "deepspeed"
    config = None if kind == "ddp" else setup.pop("deepspeed", load_config(base))
    return {"name": name, "base": base, "kind": kind, "status": "ok", "tokens_per_step": tokens_per_step,
            "tokens_per_s": tokens, "setup": {"deepspeed": config, "args": {"gradient_accumulation_steps": 2},
                                              "env": {}, "long_context": {}, **setup}}


def test_offload_targets_take_the_best_shipped_preset_row_against_the_best_plain_one():
    from hf_zero.config.presets import load_config

    bf16 = {**load_config("zero2_offload"), "bf16": {"enabled": True}}
    rows = [_offload_row("ddp@64k", "ddp", 65536, 34000), _offload_row("ddp_mbs32@64k", "ddp", 65536, 42000),
            _offload_row("zero2_offload@64k", "zero2_offload", 65536, 30000),
            _offload_row("zero2_offload_mbs32@64k", "zero2_offload", 65536, 36000),
            # faster, but not the preset as shipped: left out
            _offload_row("zero2_offload_bf16@64k", "zero2_offload", 65536, 41000, deepspeed=bf16),
            _offload_row("zero2_offload_fused@64k", "zero2_offload", 65536, 40000, long_context={"fused_loss": True}),
            _offload_row("zero3_offload@4k", "zero3_offload", 4096, 9000), _offload_row("ddp@4k", "ddp", 4096, 30000),
            _offload_row("zero2_offload@4k", "zero2_offload", 4096, 5000)]
    found = {t: (s, d) for t, s, d in report.offload_targets({"results": rows})}
    status, detail = found["zero2_offload >= 85% of the plain Trainer at 65,536 tokens per optimizer step (one GPU)"]
    assert status == "PASS" and detail.startswith("86%: 36,000 (zero2_offload_mbs32@64k) against 42,000 (ddp_mbs32@64k)")
    assert found["zero3_offload >= 26% of the plain Trainer at 4,096 tokens per optimizer step (one GPU)"][0] == "PASS"
    assert found["zero2_offload >= 31% of the plain Trainer at 4,096 tokens per optimizer step (one GPU)"][0] == "FAIL"
    assert not any("zero3_offload" in t and "65,536" in t for t in found)  # not measured there: no line
    # the slowest shipped row decides nothing; the plain Trainer missing at a batch is said
    alone = report.offload_targets({"results": rows[2:4]})
    assert [(s, d) for _, s, d in alone] == [("n/a", "no plain-Trainer row at 65,536 tokens per step")]
    # on two GPUs the one-GPU targets are not listed
    data = {"results": rows, "fingerprint": {"nproc": 2}}
    assert not any("one GPU" in t for t, _, _ in report.evaluate_targets(data))
    assert any("one GPU" in t for t, _, _ in report.evaluate_targets({**data, "fingerprint": {"nproc": 1}}))


def test_activation_offload_variant_moves_saved_activations_to_the_host_and_keeps_the_gradients():
    """activation_offload=true: the stack a user builds from torch and the Trainer alone (the long-context row)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from benchmarks.harness.worker import offload_forward_activations

    known = named_setups()
    setup = parse_variant("h=ddp:mbs=1,activation_offload=true,args.use_liger_kernel=true", known)
    assert setup.activation_offload and setup.gradient_checkpointing and setup.as_dict()["activation_offload"]
    assert not known["ddp"].activation_offload
    with pytest.raises(ConfigError, match="activation_offload must be true or false"):
        parse_variant("h=ddp:activation_offload=yes", known)

    def grads(offload):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, vocab_size=64))
        trainer = Trainer(model=model, args=TrainingArguments(output_dir="unused", report_to=[], use_cpu=True))
        packed = []
        if offload:
            offload_forward_activations(trainer)
        ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
        save_on_cpu = torch.autograd.graph.save_on_cpu
        # count what the forward hands to torch's saved-tensor hooks: nothing without the offload
        torch.autograd.graph.save_on_cpu = lambda **kw: _Counting(save_on_cpu(**kw), packed)
        try:
            loss = trainer.compute_loss(model, {"input_ids": ids, "labels": ids})
        finally:
            torch.autograd.graph.save_on_cpu = save_on_cpu
        loss.backward()
        return [p.grad for p in model.parameters()], len(packed)

    plain, none_packed = grads(False)
    offloaded, packed = grads(True)
    assert none_packed == 0 and packed > 0
    # exact on any CPU: the same kernels on the same inputs; the offload only copies saved activations out and back
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))


class _Counting:
    """Wraps a save_on_cpu context: counts the tensors it packs."""

    def __init__(self, inner, packed):
        self.inner, self.packed = inner, packed
        pack = inner.pack_hook
        inner.pack_hook = lambda tensor: (packed.append(1), pack(tensor))[1]

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


@pytest.mark.multiproc
@pytest.mark.long  # 4 tiny launches (~70 s); make test-long
def test_exactness_compares_each_setup_with_ddp_on_the_same_data(tmp_path):
    # 2 CPU ranks, every parameter's first-step gradient and the loss of every step against DDP's: DDP against DDP is
    # exact, ZeRO-2/3 differ by bf16 rounding; a setup that trains something else (a learning rate 300x) is OUTSIDE
    # (gradients against the DDP row with bf16 weights, losses against DDP's autocast)
    args = ["--exactness", "--setups", "zero3,ddp", "--variant", "ddp_again=ddp:mbs=4",
            "--variant", "ddp_bf16=ddp:mbs=4,weights=bf16",
            "--variant", "fast=zero2:args.learning_rate=3e-2", "--nproc", "2", "--steps", "4", "--warmup", "1",
            "--seq", "32"]
    proc = _bench(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    order = [line.split(":")[0] for line in proc.stdout.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert order == ["[1/5] ddp", "[2/5] ddp_again", "[3/5] ddp_bf16", "[4/5] zero3", "[5/5] fast"]  # DDP first
    rows = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    assert rows["ddp"]["exactness"]["role"] == "reference" and len(rows["ddp"]["losses"]) == 4
    assert rows["ddp_bf16"]["exactness"]["role"] == "reference"
    again, zero3, fast = (rows[n]["exactness"] for n in ("ddp_again", "zero3", "fast"))
    assert again["gradients"]["relative_error"] == 0 and again["loss_gap"] == 0
    assert zero3["reference"] == "ddp_bf16" and zero3["loss_reference"] == "ddp"
    assert zero3["gradients"]["compared"] == rows["ddp"]["exactness"]["gradients"]["parameters"]
    assert 0 < zero3["gradients"]["relative_error"] < 0.03 and zero3["loss_gap"] < 0.02
    assert fast["gradients"]["relative_error"] < 0.03 and fast["loss_gap"] > 0.02  # same first step, then apart
    table = (tmp_path / "results.md").read_text()
    verdicts = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in table.splitlines()
                if line.startswith("| ") and line.count("|") == 8}
    assert verdicts["ddp_again"] == "within" and verdicts["zero3"] == "within" and verdicts["fast"] == "OUTSIDE"
    assert "DDP against DDP (ddp_again): gradient error 0" in table


# A tiny Qwen3-MoE whose experts run transformers' eager path (a child call per expert hit): ranks with different tokens
# run different experts, so hf_zero makes the MoE blocks ZeRO-3 leaves
TINY_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000,
            "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "max_position_embeddings": 512,
            "experts_implementation": "eager"}


@pytest.mark.multiproc
@pytest.mark.long  # 3 tiny launches (~60 s); make test-long
def test_exactness_of_moe_leaves_and_their_16bit_save(tmp_path):
    # The MoE rows of the gate: ZeRO-3 with hf_zero's default leaves (each decoder layer, holding its MoE block) and
    # with the MoE blocks alone as leaves (block leaves off) train as DDP does, and the 16-bit save reloads with
    # from_pretrained to the engine's weights (the file holds one tensor per expert, the model a fused one)
    (tmp_path / "moe.json").write_text(json.dumps(TINY_MOE))
    args = ["--exactness", "--model", str(tmp_path / "moe.json"), "--setups", "ddp,zero3",
            "--variant", "ddp_bf16=ddp:mbs=4,weights=bf16", "--variant", "z3_moe_leaves=zero3:callback.leaves=off",
            "--nproc", "2", "--steps", "4", "--warmup", "1", "--seq", "32"]
    proc = _bench(args, tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["results"]}
    # (DeepSpeed's own default list flags the MoE blocks too; inside a decoder-layer leaf they are gathered with it)
    default = {"Qwen3MoeDecoderLayer": 2, "Qwen3MoeSparseMoeBlock": 2}
    for name, leaves in (("zero3", default), ("z3_moe_leaves", {"Qwen3MoeSparseMoeBlock": 2})):
        zero3 = rows[name]
        assert zero3["leaf_classes"] == leaves, (name, zero3["leaf_classes"])
        assert zero3["save"]["reload_equal"], zero3["save"]["problems"]
        assert 0 < zero3["exactness"]["gradients"]["relative_error"] < 0.03 and zero3["exactness"]["loss_gap"] < 0.02


def test_exactness_needs_ddp_and_equal_micro_batches_and_sharing_needs_gloo(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--exactness", "--setups", "zero3"]) == 2
    assert "needs a DDP setup" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--exactness", "--setups", "ddp,zero3+gc"]) == 2
    assert "micro batches differ (ddp: 4, zero3+gc: 8)" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--ranks-per-gpu", "0", "--setups", "ddp"]) == 2
    assert "--ranks-per-gpu must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_exactness_report_takes_its_loss_tolerance_from_the_ddp_noise():
    from benchmarks.harness import exactness

    def row(name, kind, grad, gap):
        return {"name": name, "kind": kind, "status": "ok", "losses": [2.0, 1.5],
                "exactness": {"role": "compared", "reference": "ddp", "loss_gap": gap,
                              "gradients": {"compared": 3, "relative_error": grad, "worst": [{"param": "w", "relative_error": grad}]}}}

    quiet = [row("ddp2", "ddp", 0.001, 0.004), row("z3", "deepspeed", 0.01, 0.011)]
    limits = exactness.tolerances(quiet)
    assert limits["loss"] == pytest.approx(0.02) and exactness.verdict(quiet[1], limits) == "within"  # the floor
    noisy = [row("ddp2", "ddp", 0.001, 0.01), row("z3", "deepspeed", 0.01, 0.025)]
    assert exactness.tolerances(noisy)["loss"] == pytest.approx(0.03)  # 3x the DDP noise
    assert exactness.verdict(noisy[1], exactness.tolerances(noisy)) == "within"
    assert exactness.verdict(row("leaf", "deepspeed", 0.2, 0.001), limits) == "OUTSIDE"  # the gradient fires alone
    assert exactness.compare({"a": torch.ones(2)}, {"b": torch.ones(2)})["compared"] == 0
    found = exactness.compare({"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([3.0])},
                              {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([4.0])})
    assert found["relative_error"] == pytest.approx(1 / 18 ** 0.5) and found["worst"][0]["param"] == "b"


def test_exactness_compares_deepspeed_gradients_with_the_ddp_row_of_the_same_arithmetic(tmp_path):
    # DeepSpeed's bf16 mode computes with bf16 weights: its gradients go against a DDP row with bf16 weights where the
    # sweep has one, its losses against DDP's fp32 weights under autocast (the fp32 master weights it keeps)
    from benchmarks.harness.run import exactness_spec

    known = named_setups()
    ddp, zero3 = known["ddp"], known["zero3"]
    ddp_bf16 = parse_variant("ddp_bf16=ddp:weights=bf16", known)
    lora = parse_variant("z3_lora=zero3:lora.r=8", known)

    def written(spec, setup):
        Path(spec["gradients"]).write_bytes(b"x")
        return spec

    first = written(exactness_spec(ddp, tmp_path), ddp)
    assert first["role"] == "reference" and first["gradients"].endswith("full.safetensors")
    alone = exactness_spec(zero3, tmp_path)
    assert alone["role"] == "compared" and alone["reference_setup"] == "ddp"  # no bf16 row yet: autocast DDP
    second = written(exactness_spec(ddp_bf16, tmp_path), ddp_bf16)
    assert second["role"] == "reference" and second["gradients"].endswith("full-bf16.safetensors")
    paired = exactness_spec(zero3, tmp_path)
    assert paired["gradients"].endswith("full-bf16.safetensors") and paired["reference_setup"] == "ddp_bf16"
    assert paired["losses"].endswith("full.losses.json") and paired["loss_reference_setup"] == "ddp"
    assert exactness_spec(lora, tmp_path)["gradients"].endswith("lora.safetensors")  # adapters: their own reference
    again = exactness_spec(parse_variant("ddp_again=ddp:mbs=4", known), tmp_path)
    assert again["role"] == "compared" and again["reference_setup"] == "ddp"  # DDP noise stays fp32 against fp32
    bf16_again = exactness_spec(parse_variant("ddp_bf16_again=ddp:weights=bf16", known), tmp_path)
    assert bf16_again["reference_setup"] == bf16_again["loss_reference_setup"] == "ddp_bf16"  # bf16 against bf16
    # the compile path: compiled kernels round differently, so its gradients go against a compiled bf16 DDP row
    z3_compile = parse_variant("z3_compile=zero3:args.torch_compile=true", known)
    assert exactness_spec(z3_compile, tmp_path)["reference_setup"] == "ddp_bf16"  # none compiled yet
    ddp_compile = parse_variant("ddp_compile_bf16=ddp:weights=bf16,args.torch_compile=true", known)
    third = written(exactness_spec(ddp_compile, tmp_path), ddp_compile)
    assert third["role"] == "reference" and third["gradients"].endswith("full-bf16-compiled.safetensors")
    compiled = exactness_spec(z3_compile, tmp_path)
    assert compiled["reference_setup"] == "ddp_compile_bf16" and compiled["loss_reference_setup"] == "ddp"
    assert exactness_spec(zero3, tmp_path)["reference_setup"] == "ddp_bf16"  # eager rows keep the eager reference
    with pytest.raises(ConfigError, match="weights='bf16'"):
        parse_variant("z3_bf16=zero3:weights=bf16", known)


def test_report_names_ranks_that_shared_a_gpu():
    data = {"fingerprint": {"nproc": 2}, "device": {"name": "NVIDIA H100"},
            "runs": [{"argv": ["x", "--ranks-per-gpu", "2", "--exactness"]}]}
    assert report.machine_text(data) == "2 ranks on 1 x NVIDIA H100 (gloo)"
    data["runs"] = [{"argv": ["x", "--nproc", "2"]}]
    assert report.machine_text(data) == "2 x NVIDIA H100"
