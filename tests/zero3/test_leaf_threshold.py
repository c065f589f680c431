"""Which modules a stage3_module_granularity_threshold makes ZeRO-3 leaves, against DeepSpeed's own marking code."""

from hf_zero.compat.deepspeed_api import is_leaf
from hf_zero.zero3.leaf_threshold import module_granularities, threshold_leaves


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
    measured = {g for _, _, g in module_granularities(model, lambda p: p.numel()).values() if g}
    thresholds = sorted({0} | measured | {g - 1 for g in measured})
    assert len(thresholds) > 8
    for threshold in thresholds:
        unset_z3_leaf_modules(model, list({type(m) for m in model.modules()}))
        # DeepSpeed's engine runs this at its start; only the marking part of it, without an engine
        marker = object.__new__(parameter_offload.DeepSpeedZeRoOffload)
        marker.min_granularity_value, marker.min_granularity_layer = sys.maxsize, None
        marker.granularity_info, marker.z3_leaf_layers = set(), []
        marker._set_z3_leaf_modules_by_threshold(model, threshold)
        marked = [name for name, m in model.named_modules() if is_leaf(m)]
        predicted = [name for name, _ in threshold_leaves(model, threshold, lambda p: p.numel())]
        assert marked == predicted, threshold
