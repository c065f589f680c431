"""ZenFlow under the Trainer: "auto" schedule values stop the Trainer's fill, a left-out schedule never reselects,
an update interval other than the run's accumulation steps the optimizer on another cadence, ZeRO-3 transposes
its weights (benchmarks/cpu/zenflow_zero3). A schedule written out for the run's accumulation passes quietly."""

import pytest

from hf_zero.config.presets import load_config
from hf_zero.config.validate import validate_config

SCHEDULE = {"select_strategy": "step", "select_interval": 4, "update_interval": 4}


def _findings(zenflow, preset="zero2_offload", accumulation=4):
    config = load_config(preset)
    config["zero_optimization"]["zenflow"] = {"topk_ratio": 0.05, "overlap_step": True, **zenflow}
    found = validate_config(config, on_cpu=False, world_size=1,
                            trainer_args={"gradient_accumulation_steps": accumulation})
    return {f.code: f for f in found}


def test_a_schedule_written_out_for_the_runs_accumulation_is_quiet():
    assert _findings(SCHEDULE) == {}


def test_auto_schedule_values_are_one_error_naming_the_values_to_write():
    found = _findings({"select_strategy": "auto", "select_interval": "auto", "update_interval": "auto"})
    assert set(found) == {"zenflow-auto"}  # not also three vague auto-unfilled errors
    assert found["zenflow-auto"].severity == "error"
    assert '"select_strategy": "step", "select_interval": 4, "update_interval": 4' in found["zenflow-auto"].fix


def test_a_left_out_schedule_warns_with_the_same_values():
    found = _findings({})
    assert set(found) == {"zenflow-schedule-left-out"} and found["zenflow-schedule-left-out"].severity == "warning"
    assert '"update_interval": 4' in found["zenflow-schedule-left-out"].fix


@pytest.mark.parametrize("update, quiet", [(4, True), (2, False)])
def test_an_update_interval_other_than_the_accumulation_warns(update, quiet):
    found = _findings({**SCHEDULE, "update_interval": update})
    assert ("zenflow-accumulation" not in found) is quiet
    if not quiet:
        assert "set zenflow.update_interval to 4" in found["zenflow-accumulation"].fix


def test_zenflow_under_zero3_is_an_error_and_under_zero2_is_quiet():
    found = _findings(SCHEDULE, preset="zero3_offload")["zenflow-zero3"]
    assert found.severity == "error" and "transposed" in found.message and "stage 2" in found.fix
    assert "zenflow-zero3" not in _findings(SCHEDULE, preset="zero2_offload")


@pytest.mark.parametrize("version, severity", [("0.19.8", "error"), ("0.17.0", "error"), ("0.20.0", "warning")])
def test_zenflow_under_zero3_is_refused_up_to_the_checked_deepspeed(version, severity):
    from hf_zero.config.rules import CheckContext, _zenflow

    config = load_config("zero3_offload")
    config["zero_optimization"]["zenflow"] = {"topk_ratio": 0.05, **SCHEDULE}
    (found,) = [f for f in _zenflow(CheckContext(config, deepspeed_version=version)) if f.code == "zenflow-zero3"]
    assert found.severity == severity
    if severity == "warning":
        assert "unchecked" in found.message and "repro.py" in found.message
