"""generate under ZeRO-3 on two ranks whose prompts end at different lengths, with synced_gpus=False: ZeroCallback
keeps the ranks stepping together, so it finishes instead of hanging in a parameter gather."""

import json

import pytest

from conftest import REPO, run_worker

pytestmark = pytest.mark.multiproc
WORKER = REPO / "tests" / "workers" / "generate_unequal.py"


def test_unequal_generation_with_synced_gpus_false_finishes(tiny_models, tmp_path):
    proc = run_worker(["--model", tiny_models["llama"], "--out", tmp_path / "run"], nproc=2, script=WORKER,
                      timeout=300)
    generated = [json.loads(line.split("GENERATED ", 1)[1]) for line in proc.stdout.splitlines() if "GENERATED " in line]
    assert sorted((g["rank"], g["new"]) for g in generated) == [(0, 2), (1, 6)]  # each rank's own length: the finished rank's dummy steps add no tokens
    assert proc.stderr.count("generate(synced_gpus=False) under ZeRO-3 on several ranks would hang") == 2
