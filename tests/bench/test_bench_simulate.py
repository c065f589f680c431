"""The benchmark harness's --simulate-ranks on CPU: real DeepSpeed engines as rank 0 of N over torch's fake group."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, worker_env
from benchmarks.harness.run import Options
from benchmarks.harness.simulate import simulate
from benchmarks.harness.cli import main
from hf_zero.errors import ConfigError


@pytest.mark.multiproc
@pytest.mark.slow  # two engine launches, 35 s warm
def test_zero3_partitions_for_the_simulated_rank_count(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.harness", "--out", str(tmp_path), "--simulate-ranks", "2,4",
           "--setups", "zero3", "--steps", "3", "--seq", "32"]
    done = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "simulated.json").read_text())
    rows = {(r["name"], r["ranks"]): r for r in data["results"]}
    assert set(rows) == {("zero3", 2), ("zero3", 4)}
    for (name, ranks), row in rows.items():
        assert row["status"] == "ok" and row["engine"] == "DeepSpeedEngine"
        assert row["world_size"] == ranks  # the Trainer and DeepSpeed saw N ranks, not 1
        # rank 0 holds 1/N of every parameter (up to DeepSpeed's padding of each partition)
        assert row["rank0_share"] == pytest.approx(1 / ranks, rel=0.05)
        assert row["setup"]["deepspeed"]["zero_optimization"]["stage"] == 3
    md = (tmp_path / "simulated.md").read_text()
    assert "| zero3 | 4 | 4 |" in md and "--simulate-ranks 2,4" in md
    assert (tmp_path / "simulated.png").read_bytes()[:4] == b"\x89PNG"
    # --report re-renders it, --replan first recomputes the planner column
    assert main(["--report", str(tmp_path / "simulated.json"), "--replan"]) == 0
    assert json.loads((tmp_path / "simulated.json").read_text())["replanned"]
    assert "planner column recomputed" in (tmp_path / "simulated.md").read_text()


def test_only_deepspeed_setups_and_real_rank_counts(tmp_path):
    with pytest.raises(ConfigError) as e:
        simulate(Options(out=str(tmp_path), setups=["zero3", "ddp", "fsdp"], repeat=2,
                         variants=["var=zero2:data.min_seq=16"]), [1, 2], progress=lambda m: None)
    problems = str(e.value)
    assert "var sets data.* keys" in problems
    assert "rank counts of 2 or more, got 1" in problems
    assert "DeepSpeed setups only, not ddp, fsdp" in problems
    assert "--repeat does not apply" in problems
    assert not (tmp_path / "simulated.json").exists()


def test_default_setups_are_the_deepspeed_ones(tmp_path, monkeypatch, capsys):
    assert main(["--list", "--simulate-ranks", "2,4"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert "zero3" in listed and "ddp" not in listed and len(listed) == len(set(listed))
    launched = []
    monkeypatch.setattr("benchmarks.harness.simulate._launch",
                        lambda setup, n, *rest: launched.append(setup.name) or {"status": "failed", "error": "x",
                                                                                  "name": setup.name, "ranks": n,
                                                                                  "micro_batch": 4})
    assert simulate(Options(out=str(tmp_path)), [2], progress=lambda m: None) == 1
    assert "zero3" in launched and "zero2+gc" in launched
    assert not {"ddp", "fsdp", "ddp+gc", "fsdp+gc"} & set(launched)
