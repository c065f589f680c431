"""hf_zero's public names: each importable from hf_zero, loaded on first use."""

import subprocess
import sys

import pytest

import hf_zero


@pytest.mark.parametrize("name", hf_zero.__all__)
def test_every_public_name_resolves(name):
    assert getattr(hf_zero, name) is not None


def test_import_hf_zero_loads_neither_torch_nor_deepspeed():
    probe = "import sys, hf_zero; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hf_zero.nope  # noqa: B018


def test_lora_namespace_keeps_its_names():
    from hf_zero import lora

    for name in ("save_adapter", "merge_and_save", "adapter_problems", "adapter_state_dict", "peft_recompute_problems",
                 "no_leaf_modules_with_frozen_weights", "adapters_to_training_dtype", "zero2_advice"):
        assert callable(getattr(lora, name)), name
