"""Mixture-of-experts models under ZeRO-3 on two ranks whose tokens go to different experts: transformers' fused
architectures on both experts paths (grouped_mm, eager) and a ModuleList MoE (as remote code builds them) train, their
checkpoints pass ZeroCallback's save check and reload bitwise. All cases of a test run in one launch (one process
group, one case after another). With hf_zero's MoE leaves off, the eager and ModuleList cases fail."""

import json
import sys

import pytest

from conftest import REPO, assert_reload_bitwise, run_worker

sys.path.insert(0, str(REPO / "tests" / "workers"))
from moe_models import FUSED  # noqa: E402  (also registers the ModuleList model for the reload)

pytestmark = pytest.mark.multiproc
WORKER = REPO / "tests" / "workers" / "train_moe.py"
# the ZeRO-3 leaves each case trains with: hf_zero's where ranks can run different modules, DeepSpeed's own default
# classes (Mixtral, Qwen2-MoE, Qwen3-MoE blocks) on either path, none where one module call runs every expert
LEAVES = {"qwen3_moe": ["Qwen3MoeSparseMoeBlock"] * 2, "mixtral": ["MixtralSparseMoeBlock"] * 2,
          "qwen2_moe": ["Qwen2MoeSparseMoeBlock"] * 2, "gpt_oss": [], "deepseek_v3": [], "olmoe": []}
EAGER_LEAVES = {"deepseek_v3": ["DeepseekV3MoE"], "olmoe": ["OlmoeSparseMoeBlock"] * 2}


# with hf_zero's default block leaves, each decoder layer is the leaf, holding its MoE block (the ModuleList model's
# layers are its MoE blocks)
BLOCK_LEAVES = {"deepseek_v3": ["DeepseekV3DecoderLayer"] * 2, "olmoe": ["OlmoeDecoderLayer"] * 2,
                "modulelist": ["ListMoeBlock"] * 2}


def expected_leaves(case: str, block_leaves: bool = False) -> list:
    if block_leaves:
        return BLOCK_LEAVES[case.split(":")[0]]
    if case == "modulelist":
        return ["ListMoeBlock"] * 2
    arch, impl = case.split(":")
    return EAGER_LEAVES.get(arch, LEAVES[arch]) if impl == "eager" else LEAVES[arch]


def _train(tmp_path, cases, *flags, expect_fail=False):
    launcher = "accelerate:zero3" if "--loop" in flags else None
    return run_worker(["--out", tmp_path, "--cases", ",".join(cases), *flags], nproc=2, script=WORKER,
                      launcher=launcher, expect_fail=expect_fail, timeout=600)


def _check(tmp_path, cases, *flags):
    proc = _train(tmp_path, cases, *flags)
    results = [json.loads(line.split("CASE ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("CASE ")]
    assert sorted((r["case"], r["rank"]) for r in results) == sorted((c, rank) for c in cases for rank in (0, 1))
    for result in results:
        assert result["leaves"] == expected_leaves(result["case"], "auto" in flags), result
        losses = result["losses"]
        assert len(losses) == 2 and losses[1] < losses[0], result
    for case in cases:  # the checkpoint ZeroCallback checked, from_pretrained in this clean process
        assert_reload_bitwise(tmp_path / case.replace(":", "-"), folder="checkpoint-2")


def test_moe_models_train_with_decoder_layer_leaves_and_reload_bitwise(tmp_path):
    # one of each kind, as hf_zero runs them by default: every decoder layer a leaf, holding its MoE block whole: a
    # fused model's eager path, its grouped_mm path, a ModuleList MoE
    _check(tmp_path, ["deepseek_v3:eager", "olmoe:grouped_mm", "modulelist"], "--leaves", "auto")


@pytest.mark.slow
def test_every_fused_architecture_on_both_paths_trains_and_reloads_bitwise(tmp_path):
    # moe-leaves alone (block leaves off): a fused model's eager path (a leaf), its grouped_mm path (left as
    # transformers runs it), a ModuleList MoE (a leaf per block)
    _check(tmp_path, [f"{arch}:{impl}" for arch in FUSED for impl in ("grouped_mm", "eager")] + ["modulelist"])


@pytest.mark.slow
@pytest.mark.parametrize("case, failure", [
    ("modulelist", "RanksDivergedError: ZeRO-3 ranks diverged at step 0"),
    ("deepseek_v3:eager", "Detected a disagreement on list length between rank0 and rank1"),
], ids=["modulelist", "deepseek_v3-eager"])
def test_without_moe_leaves_ranks_that_route_differently_fail(tmp_path, case, failure):
    proc = _train(tmp_path, [case], "--moe-leaves", "off", expect_fail=True)
    assert failure in proc.stderr


@pytest.mark.slow
def test_an_accelerate_loop_gets_the_same_leaves_from_prepare(tmp_path):
    _check(tmp_path, ["modulelist"], "--loop")


@pytest.mark.slow
def test_an_accelerate_loop_without_moe_leaves_fails(tmp_path):
    proc = _train(tmp_path, ["modulelist"], "--loop", "--moe-leaves", "off", expect_fail=True)
    assert "RanksDivergedError: ZeRO-3 ranks diverged at step 0" in proc.stderr
