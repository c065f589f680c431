"""ZeRO-Infinity's parameter swapper under a reuse distance: each parameter kept for reuse holds one swap buffer
(tests/multiproc/test_nvme_swap.py runs the failure and the fix on CPU)."""

import pytest

from hf_zero.config.presets import load_config
from hf_zero.config.rules import fix_config
from hf_zero.config.validate import validate_config


def _codes(config):
    return {f.code: f for f in validate_config(config, on_cpu=True)}


def test_the_nvme_preset_releases_parameters_right_after_use(tmp_path):
    assert "nvme-param-reuse" not in _codes(load_config("zero3_nvme", nvme_path=tmp_path))


@pytest.mark.parametrize("reuse", [1_000_000_000, 1e9, 1, "1e9", None])  # None: left out, DeepSpeed's default 1e9
def test_a_reuse_distance_with_parameters_on_nvme_warns_and_fix_sets_zero(tmp_path, reuse):
    config = load_config("zero3_nvme", nvme_path=tmp_path)
    config["zero_optimization"].pop("stage3_max_reuse_distance")
    if reuse is not None:
        config["zero_optimization"]["stage3_max_reuse_distance"] = reuse
    found = _codes(config)["nvme-param-reuse"]
    assert found.severity == "warning" and "Not enough buffers" in found.message
    fixed = fix_config(config, list(_codes(config).values()))
    assert fixed["zero_optimization"]["stage3_max_reuse_distance"] == 0
    assert "nvme-param-reuse" not in _codes(fixed)


def test_a_reuse_distance_is_quiet_when_parameters_stay_in_host_memory(tmp_path):
    # zero3_offload: parameters on the CPU have no swap buffers to run out of; optimizer states on NVMe neither
    config = load_config("zero3_offload")
    config["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": str(tmp_path)}
    assert config["zero_optimization"]["stage3_max_reuse_distance"] > 0
    assert "nvme-param-reuse" not in _codes(config)
