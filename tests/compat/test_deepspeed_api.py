"""What hf_zero knows about DeepSpeed releases: the engine fixes' windows and their WARNING, the releases a bug was
fixed in, and checkpoint contents."""

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

    from hf_zero.engine.fixes import offload_overflow_syncs_removed

    optimizer = SimpleNamespace(cpu_offload=True, compute_grad_norm=True, zenflow=False,
                                update_offload_overflow_tracker=lambda grad: None)
    with caplog.at_level(logging.WARNING, logger="hf_zero"):
        assert offload_overflow_syncs_removed(SimpleNamespace(optimizer=optimizer), version="0.20.0") is None
    assert any("not applied on DeepSpeed 0.20.0" in r.getMessage() for r in caplog.records)


def test_an_engine_that_needs_no_fix_says_nothing_on_any_release(fresh_warnings, caplog):
    from types import SimpleNamespace

    from hf_zero.engine.fixes import offload_overflow_syncs_removed

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


def test_zenflow_zero3_is_unchecked_only_above_the_release_it_was_seen_to_break_in():
    assert not deepspeed_api.zenflow_zero3_unchecked("0.19.8") and not deepspeed_api.zenflow_zero3_unchecked("0.18.0")
    assert deepspeed_api.zenflow_zero3_unchecked("0.19.9") and deepspeed_api.zenflow_zero3_unchecked("0.20.0")


def test_only_the_zero12_optimizer_has_the_offload_overflow_tracker():
    stage12, stage3 = deepspeed_api.zero_optimizer_classes()
    assert deepspeed_api.has_offload_overflow_tracker(stage12)
    assert not deepspeed_api.has_offload_overflow_tracker(stage3)
