"""The benchmark harness's --host-peaks: the sampler credits a rise of resident memory to the code that made it."""

import time

import torch

from benchmarks.harness.host_peaks import GIB, HostPeakSampler
from benchmarks.harness.report import host_peaks_table


def allocate_half_a_gib():
    block = torch.ones(GIB // 2, dtype=torch.uint8)  # written, so resident
    time.sleep(0.2)
    return block


def test_a_rise_is_credited_to_the_code_that_allocated():
    sampler = HostPeakSampler(step=64 * 1024**2).start()
    sampler.phase = "train"
    block = allocate_half_a_gib()
    summary = sampler.stop()
    top = summary["rises"][0]
    assert top["phase"] == "train" and "allocate_half_a_gib" in top["code"], summary["rises"]
    assert 0.4 < sum(r["gib"] for r in summary["rises"]) + summary["other_gib"] < 0.7
    assert summary["peak_gib"] - summary["start_gib"] > 0.45
    assert summary["peak_gib"] - summary["timeline"][-1]["rss_gib"] < summary["step_gib"]
    del block


def test_no_rise_without_growth():
    sampler = HostPeakSampler(step=64 * 1024**2).start()
    time.sleep(0.1)
    summary = sampler.stop()
    assert summary["rises"] == [] and summary["timeline"] == []


def test_report_lists_the_rises_of_rows_that_have_them():
    peaks = {"start_gib": 1.0, "peak_gib": 3.5, "step_gib": 0.125, "other_gib": 0.25, "timeline": [],
             "rises": [{"phase": "init", "code": "deepspeed/runtime/zero/stage3.py:1136 (_create_fp32_partitions)",
                        "gib": 2.25}]}
    data = {"results": [{"name": "zero3_nvme", "status": "ok", "host_peaks": peaks},
                        {"name": "ddp", "status": "ok"}]}
    table = host_peaks_table(data)
    assert "| zero3_nvme | | **peak resident, from 1.00 at launch** | **3.50** |" in table
    assert "| | init | `deepspeed/runtime/zero/stage3.py:1136 (_create_fp32_partitions)` | 2.25 |" in table
    assert "other code | 0.25" in table and "ddp" not in table
    assert host_peaks_table({"results": [{"name": "ddp", "status": "ok"}]}) == ""
