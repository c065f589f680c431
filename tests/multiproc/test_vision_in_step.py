"""Vision-language models under ZeRO-3 on two ranks whose batches hold different modalities (one worker launch runs
several cases in one process group; tests/workers/vision_in_step.py): they train, save and reload bitwise, a text-only
rank's loss keeps its bits, alternating image/text steps keep DeepSpeed's trace, and without the dummy (or with a tower
that rejects it) every rank stops with the modules named."""

import json
from pathlib import Path

import pytest
import torch

from conftest import REPO, assert_reload_bitwise, run_worker

pytestmark = pytest.mark.multiproc
WORKER = REPO / "tests" / "workers" / "vision_in_step.py"
CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
           "llava": "LlavaForConditionalGeneration"}


def _run(tmp_path, cases):
    proc = run_worker(["--out", tmp_path, "--cases", *cases], nproc=2, script=WORKER, timeout=900)
    return _by_case(proc.stdout, cases)


def _by_case(stdout: str, cases) -> dict:
    """case -> {"ends": [result per rank], "diverged": [message per rank], "invalidations": n}."""
    found = {case: {"ends": [], "diverged": [], "invalidations": 0} for case in cases}
    current = None
    for line in stdout.splitlines():
        if line.startswith("CASE "):
            _, case, what, *rest = line.split(" ", 3)
            current = case
            if what == "END":
                found[case]["ends"].append(json.loads(rest[0]))
            elif what == "DIVERGED":
                found[case]["diverged"].append(rest[0])
        elif "Invalidate trace cache" in line and current:
            found[current]["invalidations"] += 1
    return found


def _trained_and_exact(tmp_path, found, cases):
    for index, case in enumerate(cases):
        family = case.split(":")[0]
        ends = sorted(found[case]["ends"], key=lambda r: r["rank"])
        assert [r["rank"] for r in ends] == [0, 1], found[case]
        assert all(r["engine"] == "DeepSpeedEngine" for r in ends)
        losses = ends[0]["losses"]
        assert losses[-1] < losses[0], losses
        assert ends[0]["dummy_passes"] == 0 and ends[1]["dummy_passes"] > 0  # rank 1 never has an image
        folder = Path(tmp_path) / str(index)
        model = assert_reload_bitwise(folder, CLASSES[family])
        # rank 1's text-only loss under ZeRO-3, rank 0 running the tower on an image at the same time, has the bits
        # the reloaded weights give the same batch on one process, with no dummy anywhere
        batch = torch.load(folder / "text_batch.pt")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the workers' thread count, so the reductions add in the same order
        try:
            with torch.no_grad():
                reference = float(model.eval()(**batch).loss)
        finally:
            torch.set_num_threads(threads)
        assert reference.hex() == ends[1]["eval_loss_hex"], (reference, float.fromhex(ends[1]["eval_loss_hex"]))


FAST = ["qwen2_vl:zero3:mixed", "llava:zero3:alternate", "llava:zero3:alternate:per_step",
        "llava:zero3:mixed:off", "qwen2_vl:zero3:mixed:off", "llava:zero3:mixed:bad_tower"]


def test_mixed_modalities_train_keep_the_trace_and_stop_when_the_dummy_cannot_run(tmp_path):
    found = _run(tmp_path, FAST)
    _trained_and_exact(tmp_path, found, FAST[:1])
    # images and text in turn on both ranks: the tower runs every step, so the trace holds (one re-trace, where the
    # dummy was first tried); run only where some rank has images ("per_step"), it is dropped every other step
    assert len(found["llava:zero3:alternate"]["ends"]) == 2
    assert found["llava:zero3:alternate"]["invalidations"] <= 1, found["llava:zero3:alternate"]
    assert found["llava:zero3:alternate:per_step"]["invalidations"] >= 3, found["llava:zero3:alternate:per_step"]
    # the dummy off: the divergence check stops both ranks at the first vision module, naming it
    off = found["llava:zero3:mixed:off"]["diverged"]
    assert len(off) == 2 and all("rank 0: 'model.vision_tower" in m and "step 0" in m for m in off), off
    # Qwen2-VL's patch embedding reads its convolution's weight before the convolution's own hook: its container's
    # check stops both ranks within seconds too
    off = found["qwen2_vl:zero3:mixed:off"]["diverged"]
    assert len(off) == 2 and all("rank 0: 'model.visual" in m and "step 0" in m for m in off), off
    # a tower that rejects the dummy: both ranks stop with the tower named, before any gather differs
    bad = found["llava:zero3:mixed:bad_tower"]["diverged"]
    assert len(bad) == 2 and all("'model.vision_tower'" in m and "dummy input" in m and "Fix:" in m for m in bad), bad


SLOW = ["llava:zero3:mixed", "qwen2_vl:zero3_offload:mixed", "llava:zero3_offload:mixed", "qwen2_5_vl:zero3:mixed"]


@pytest.mark.slow
def test_mixed_modalities_other_families_and_offload(tmp_path):
    found = _run(tmp_path, SLOW)
    _trained_and_exact(tmp_path, found, SLOW)
