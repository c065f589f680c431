"""What hf_zero knows about DeepSpeed releases: the engine fixes' windows and their WARNING, checkpoint contents,
and zero_to_fp32's materialization in another dtype."""

import logging

import pytest

from hf_zero.compat import deepspeed_api


@pytest.fixture
def fresh_warnings():
    deepspeed_api._warned.clear()
    yield
    deepspeed_api._warned.clear()


def test_fix_inside_its_window_applies_without_a_word(fresh_warnings, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        assert deepspeed_api.engine_fix_applies("offload-step-in-forward", "0.19.8")
        assert deepspeed_api.engine_fix_applies("offload-step-in-forward", "0.19.12")
    assert caplog.records == []


def test_fix_outside_its_window_warns_once_naming_what_is_skipped(fresh_warnings, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        assert not deepspeed_api.engine_fix_applies("offload-step-in-forward", "0.20.1")
        assert not deepspeed_api.engine_fix_applies("offload-step-in-forward", "0.20.1")
        assert not deepspeed_api.engine_fix_applies("pinned-update-copy", "0.18.0")
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == [
        "hf_zero: offload step in the next forward: not applied on DeepSpeed 0.20.1 (read against 0.19.8 to below "
        "0.20); expect DeepSpeed's own step speed. See docs/versions.md.",
        "hf_zero: ZeRO-3 offload updates copied through pinned memory: not applied on DeepSpeed 0.18.0 (read against "
        "0.19.8 to below 0.20); DeepSpeed's synchronous copy of each updated sub-group from pageable memory. See "
        "docs/versions.md."]


def test_engine_fix_on_an_engine_outside_the_window_warns(fresh_warnings, caplog):
    from types import SimpleNamespace

    from hf_zero.engine_fixes import offload_overflow_syncs_removed

    optimizer = SimpleNamespace(cpu_offload=True, compute_grad_norm=True, zenflow=False,
                                update_offload_overflow_tracker=lambda grad: None)
    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        assert offload_overflow_syncs_removed(SimpleNamespace(optimizer=optimizer), version="0.20.0") is None
    assert any("not applied on DeepSpeed 0.20.0" in r.getMessage() for r in caplog.records)


def test_an_engine_that_needs_no_fix_says_nothing_on_any_release(fresh_warnings, caplog):
    from types import SimpleNamespace

    from hf_zero.engine_fixes import offload_overflow_syncs_removed

    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        assert offload_overflow_syncs_removed(SimpleNamespace(optimizer=SimpleNamespace(cpu_offload=False)),
                                              version="0.20.0") is None
    assert caplog.records == []


def test_frozen_recompute_fix_release():
    assert deepspeed_api.frozen_recompute_fails("0.19.2") and deepspeed_api.frozen_recompute_fails("0.18.0")
    assert not deepspeed_api.frozen_recompute_fails("0.19.3")


def test_a_set_passes_the_checkpoint_scan_and_code_does_not(tmp_path):
    import torch

    from hf_zero.checkpoints.safe_load import disallowed_globals, safe_torch_load

    # what DeepSpeed before 0.19 writes into model_states
    torch.save({"sparse_tensor_module_names": {"embed.weight"}, "module": {"w": torch.ones(2)}}, tmp_path / "a.pt")
    assert disallowed_globals(tmp_path / "a.pt") == []
    assert safe_torch_load(tmp_path / "a.pt")["sparse_tensor_module_names"] == {"embed.weight"}
    torch.save({"hook": print}, tmp_path / "b.pt")
    assert disallowed_globals(tmp_path / "b.pt") == ["builtins.print"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_conversion_after_materializing_matches_deepspeeds_own(dtype):
    """The path for DeepSpeed releases whose to_torch_tensor has no dtype gives what newer ones give themselves."""
    import inspect

    import torch
    from deepspeed.utils.zero_to_fp32 import to_torch_tensor

    if "dtype" not in inspect.signature(to_torch_tensor).parameters:
        pytest.skip("this DeepSpeed converts only after materializing (the path under test is the one it takes)")
    shared = torch.randn(4, 3)
    state = {"a": shared, "tied": shared, "b": torch.randn(5), "index": torch.arange(3)}
    ours = deepspeed_api._converted(to_torch_tensor(dict(state)), dtype)
    theirs = to_torch_tensor(dict(state), dtype=dtype)
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)
    assert ours["a"] is ours["tied"] and ours["index"].dtype == torch.int64


def test_threshold_leaves_are_the_modules_deepspeeds_own_rule_marks(monkeypatch):
    """The mirror of stage3_module_granularity_threshold against DeepSpeed's own marking code (the installed
    release's), at every threshold that changes which modules of a tiny Qwen2-VL become leaves."""
    import sys

    from deepspeed.runtime.zero import parameter_offload
    from deepspeed.utils import unset_z3_leaf_modules

    from tiny_vlm import build

    monkeypatch.setattr(parameter_offload, "print_rank_0", lambda *a, **k: None)  # asks for a process group

    model = build("qwen2_vl")
    for p in model.parameters():
        p.ds_numel = p.numel()  # what DeepSpeed's rule reads; set on a ZeRO-3 parameter
    measured = {g for _, _, g in deepspeed_api.module_granularities(model, lambda p: p.numel()).values() if g}
    thresholds = sorted({0} | measured | {g - 1 for g in measured})
    assert len(thresholds) > 8
    for threshold in thresholds:
        unset_z3_leaf_modules(model, list({type(m) for m in model.modules()}))
        # DeepSpeed's engine runs this at its start; only the marking part of it, without an engine
        marker = object.__new__(parameter_offload.DeepSpeedZeRoOffload)
        marker.min_granularity_value, marker.min_granularity_layer = sys.maxsize, None
        marker.granularity_info, marker.z3_leaf_layers = set(), []
        marker._set_z3_leaf_modules_by_threshold(model, threshold)
        marked = [name for name, m in model.named_modules() if deepspeed_api.is_leaf(m)]
        predicted = [name for name, _ in deepspeed_api.threshold_leaves(model, threshold, lambda p: p.numel())]
        assert marked == predicted, threshold
