"""zero.Init loading outside the Trainer: partitioned, "auto" accepted, global config removed on request."""

import subprocess
import sys

from conftest import REPO, worker_env

SCRIPT = r"""
import sys, torch
from transformers import AutoModelForCausalLM
from transformers.integrations import is_deepspeed_zero3_enabled
import hf_zero

path = sys.argv[1]
# the zero3 preset is full of "auto" values; no TrainingArguments exist yet
model = hf_zero.from_pretrained(AutoModelForCausalLM, path, "zero3", dtype=torch.bfloat16)
assert hf_zero.is_partitioned(model), "not partitioned"
assert all(p.numel() == 0 for p in model.parameters()), "a rank holds whole parameters"
assert next(model.parameters()).dtype == torch.bfloat16
assert not is_deepspeed_zero3_enabled(), "global HF DeepSpeed config left alive"
# so a later plain load (e.g. a reload on rank 0) is whole, not a collective that would hang
assert not hf_zero.is_partitioned(AutoModelForCausalLM.from_pretrained(path))

kept = hf_zero.from_pretrained(AutoModelForCausalLM, path, "zero3", keep_config=True)
assert is_deepspeed_zero3_enabled(), "keep_config=True should keep it"
assert hf_zero.is_partitioned(AutoModelForCausalLM.from_pretrained(path))
hf_zero.release_zero3_config()
assert not is_deepspeed_zero3_enabled()

# stages 1/2 keep whole parameters: a plain from_pretrained
assert not hf_zero.from_pretrained(AutoModelForCausalLM, path, "zero2").parameters().__next__().numel() == 0
try:
    with hf_zero.zero3_init("zero2"):
        pass
except ValueError as e:
    assert "stage-3" in str(e)
else:
    raise AssertionError("zero3_init accepted a stage-2 config")
hf_zero.shutdown()
print("LOADING-OK")
"""


def test_from_pretrained_partitions_and_cleans_up(tiny_models):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_models["llama"])], cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "LOADING-OK" in proc.stdout, proc.stderr[-4000:]
