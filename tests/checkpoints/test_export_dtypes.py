"""hf-zero export's dtype conversion of zero_to_fp32's tensors, for DeepSpeed releases that cannot convert while they
materialize."""

import pytest

from hf_zero.checkpoints.export import _converted


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
    ours = _converted(to_torch_tensor(dict(state)), dtype)
    theirs = to_torch_tensor(dict(state), dtype=dtype)
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)
    assert ours["a"] is ours["tied"] and ours["index"].dtype == torch.int64
