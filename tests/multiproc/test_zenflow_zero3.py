"""Why `hf-zero check` refuses ZenFlow under ZeRO-3: the installed DeepSpeed's behaviour, run on CPU
(benchmarks/cpu/zenflow_zero3/repro.py). If a DeepSpeed release fixes it, these go red: then lift the refusal
(hf_zero.config.rules.ZENFLOW_ZERO3_CHECKED)."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, worker_env

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
REPRO = REPO / "benchmarks" / "cpu" / "zenflow_zero3" / "repro.py"


def _repro(case: str) -> dict:
    proc = subprocess.run([sys.executable, str(REPRO), case], cwd=REPRO.parent, env=worker_env(), capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1])


def test_a_model_built_under_zero_init_reads_a_transposed_embedding():
    assert _repro("init")["forward"].startswith("IndexError")


def test_the_16bit_save_writes_every_matrix_transposed_and_without_zenflow_it_does_not():
    zenflow, plain = _repro("save"), _repro("save-plain")
    assert zenflow["saved_transposed"] == zenflow["differ"] == 16  # every 2-D weight of the 2-layer Llama
    assert plain["differ"] == 0
