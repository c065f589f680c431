"""hf_zero.checks' arguments moment: the checks hf_zero.TrainingArguments (and zero_arguments' classes) run when the
arguments are built, before any process group or model exists, each skippable by its id on the arguments.

Each case builds real arguments in one fresh process (a successful build starts a process group), and records what
hf_zero refused, or that the arguments were built."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, worker_env

PROBE = """
import json, sys, transformers
import hf_zero

def build(cls=hf_zero.TrainingArguments, **kwargs):
    try:
        args = cls(output_dir=sys.argv[1], report_to=[], **kwargs)
    except hf_zero.ConfigError as e:
        return {"refused": str(e)}
    except ValueError as e:  # transformers' own refusal, once hf_zero's check is out of the way
        return {"transformers": str(e)}
    return {"built": list(args.skip_checks)}

bogus = {**hf_zero.load_config("zero2"), "bogus": 1}
cases = {
    "fp16": build(deepspeed="zero2", fp16=True),
    "fp16_skipped": build(deepspeed="zero2", fp16=True, skip_checks=["fp16-arguments-on-cpu"]),
    "bf16": build(deepspeed="zero2", bf16=True),
    "bogus": build(deepspeed=bogus),
    "bogus_finding_skipped": build(deepspeed=bogus, skip_checks=["deepspeed-config/unknown-key"]),
    "bogus_other_finding_skipped": build(deepspeed=bogus, skip_checks=["deepspeed-config/fp16-on-cpu"]),
    "bogus_check_skipped": build(deepspeed=bogus, skip_checks=["deepspeed-config"]),
    "unknown_id": build(deepspeed="zero2", skip_checks=["deepspeed-configs"]),
    "glued_class": build(hf_zero.zero_arguments(transformers.Seq2SeqTrainingArguments), deepspeed=bogus,
                         skip_checks=["deepspeed-config/unknown-key"]),
}
print("CASES:" + json.dumps(cases))
"""


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("launch_checks")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out)], capture_output=True, text=True, cwd=REPO,
                          env=worker_env(), timeout=300)
    line = next((row for row in proc.stdout.splitlines() if row.startswith("CASES:")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line.removeprefix("CASES:"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is fine on GPUs")
def test_fp16_arguments_on_cpu(cases):
    assert cases["fp16"] == {"refused": "zero2: fp16 was requested, but DeepSpeed on the CPU does not support fp16. "
                                        "Fix: use --bf16 (or no mixed precision) on CPU machines. "
                                        "[check fp16-arguments-on-cpu]"}
    assert "refused" not in cases["fp16_skipped"]  # hf_zero out of the way: transformers' own word on it
    assert cases["bf16"] == {"built": []}


def test_the_config_linter_on_the_arguments(cases):
    assert cases["bogus"]["refused"].endswith("DeepSpeed silently ignores the top-level key 'bogus'. Fix: remove it or "
                                              "correct its spelling (see deepspeed.ai/docs/config-json). "
                                              "[check deepspeed-config/unknown-key]")
    assert cases["bogus_finding_skipped"] == {"built": ["deepspeed-config/unknown-key"]}
    assert "refused" in cases["bogus_other_finding_skipped"]  # another finding's id leaves this one in
    assert cases["bogus_check_skipped"] == {"built": ["deepspeed-config"]}
    assert cases["glued_class"] == {"built": ["deepspeed-config/unknown-key"]}


def test_an_unknown_id_on_the_arguments_is_refused_with_the_ids(cases):
    assert "skip_checks names ['deepspeed-configs'], which are not check ids" in cases["unknown_id"]["refused"]
