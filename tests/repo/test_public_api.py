"""hf_zero's public names: each importable from hf_zero, loaded on first use, and old module paths still import."""

import importlib
import subprocess
import sys
import warnings

import pytest

import hf_zero
from hf_zero.moved_modules import MOVED


@pytest.mark.parametrize("name", hf_zero.__all__)
def test_every_public_name_resolves(name):
    assert getattr(hf_zero, name) is not None


def test_import_hf_zero_loads_neither_torch_nor_deepspeed():
    probe = "import sys, hf_zero; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hf_zero.nope  # noqa: B018


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_path_imports_the_new_module_with_a_warning(old, new):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_lora_namespace_keeps_its_names():
    from hf_zero import lora

    for name in ("save_adapter", "merge_and_save", "adapter_problems", "adapter_state_dict", "checkpointing_problems",
                 "no_leaf_modules_with_frozen_weights", "adapters_to_training_dtype", "zero2_advice"):
        assert callable(getattr(lora, name)), name
