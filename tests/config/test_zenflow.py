"""ZenFlow under the Trainer: "auto" schedule values stop the Trainer's fill, a left-out schedule never reselects,
an update interval other than the run's accumulation steps the optimizer on another cadence, ZeRO-3 failed on a
GPU. A schedule written out for the run's accumulation passes quietly."""

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


def test_zenflow_under_zero3_warns_and_under_zero2_does_not():
    assert "zenflow-zero3" in _findings(SCHEDULE, preset="zero3_offload")
    assert "zenflow-zero3" not in _findings(SCHEDULE, preset="zero2_offload")
