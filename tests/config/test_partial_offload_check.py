"""ZeRO-3 with part of the optimizer on the GPU (offload_optimizer.ratio below 1) and the parameters on the host:
a warning with the measured numbers and the fix, quiet for every other placement. It never refuses the config."""

import pytest

from hf_zero.cli import main
from hf_zero.config.presets import load_config
from hf_zero.config.validate import validate_config

CODE = "partial-offload-params-on-host"


def _codes(config):
    return {f.code: f for f in validate_config(config, on_cpu=False, world_size=1, trainer_args={})}


def _partial(ratio=0.5, params=True):
    config = load_config("zero3_offload")
    config["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
    if not params:
        del config["zero_optimization"]["offload_param"]
    return config


def test_fires_with_the_parameters_on_the_host():
    found = _codes(_partial())[CODE]
    assert found.severity == "warning" and "offload_optimizer.ratio 0.5" in found.message
    assert "offload.md" in found.message and "remove zero_optimization.offload_param" in found.fix


@pytest.mark.parametrize("config", [
    load_config("zero3_offload"),  # the whole optimizer on the host
    _partial(0.3, params=False),  # the parameters on the GPU: the fast split
    _partial(0.0, params=False),
])
def test_quiet_for_other_placements(config):
    assert CODE not in _codes(config)


def test_quiet_without_zero3():
    config = load_config("zero2_offload")
    config["zero_optimization"]["offload_param"] = {"device": "cpu"}  # no meaning under ZeRO-2
    assert CODE not in _codes(config)


def test_the_check_warns_and_passes(tmp_path, capsys):
    import json

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(_partial()))
    assert main(["check", str(path), "--no-env"]) == 0
    assert f"warning [{CODE}]" in capsys.readouterr().out
