"""Vision-language models under ZeRO-3 with batches whose modalities differ across ranks.

ZeRO-3 gathers each module's parameters with a collective when the module runs. When one rank's batch has an image
(or a video) and another's is text only, the first runs the vision tower and the second does not, and the gathers stop
matching (gloo aborts with "collective mismatch", NCCL hangs). ``VisionInStep`` keeps the ranks in step: before each
forward the ranks exchange how many vision passes their batch makes (one small all_reduce on a host gloo group), and a
rank with fewer runs the vision tower on a tiny dummy input (zeros sized from the model's vision config) right after
its input embeddings, where the models run the real one (Qwen2-VL, Qwen2.5-VL, LLaVA: embeddings, then
get_image_features, then the language model). The dummy's features join the graph as an exact -0.0 added to the
embeddings: the loss and every gradient of the rank's real data keep their bits; the vision tower gets zero gradients
from that rank, as an unused module would, and its backward gathers and reduce-scatters happen on every rank alike.

"keep" (the default) goes on running the vision tower in every training forward once any rank has run it: DeepSpeed
records the order in which ZeRO-3 fetches modules and drops that trace (and its prefetch) whenever a step differs, so
image and text steps alternating would re-trace every step. Its cost is one dummy vision pass (a few patches) per
forward on ranks without images. "per_step" runs the dummy only in forwards where some rank has vision input.
"""

import inspect
import logging

from ..errors import RanksDivergedError
from ..distributed import host_group
from .divergence import WAIT_S, compiled_whole, zero3_on_several_ranks

logger = logging.getLogger("hf_zero")

VISION_IN_STEP = ("keep", "per_step", "off")
# The model's keyword arguments that carry vision input: each one not None makes the model run its vision tower once
# (pixel_values -> get_image_features, pixel_values_videos -> get_video_features)
_VISION_PREFIX = "pixel_values"


def vision_in_step_problem(value) -> str | None:
    """Why ``value`` cannot be the vision_in_step option (None when it can)."""
    if value in VISION_IN_STEP:
        return None
    return (f"vision_in_step must be one of {', '.join(map(repr, VISION_IN_STEP))}, got {value!r}. Fix: "
            "vision_in_step='keep' (every rank runs the vision tower in every training forward once any rank has), "
            "'per_step' (only in forwards where some rank has images or video), or 'off'.")


def vision_language_model(model):
    """The outermost module of ``model`` (a VLM, or a wrapper such as peft's) that has its own get_image_features,
    input embeddings and a vision config; None for a model without a vision tower."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if (callable(getattr(type(module), "get_image_features", None))
                and callable(getattr(type(module), "get_input_embeddings", None))
                and getattr(config, "vision_config", None) is not None):
            return module
    return None


def vision_input_count(kwargs: dict) -> int:
    """How many vision passes a forward with these keyword arguments makes (the models test each for None)."""
    return sum(1 for name, value in kwargs.items() if name.startswith(_VISION_PREFIX) and value is not None)


def _size_pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def dummy_vision_input(vlm, dtype, device) -> dict:
    """get_image_features' arguments for the smallest input the vision tower takes, sized from the vision config:
    one merge window of patches for models that take flattened patches with a (t, h, w) grid (Qwen2-VL family), one
    image of the configured size otherwise. Raises (AttributeError, TypeError, ...) where the config cannot tell."""
    import torch

    vision = vlm.config.vision_config
    if "image_grid_thw" in inspect.signature(vlm.get_image_features).parameters:
        merge = int(getattr(vision, "spatial_merge_size", 1))
        height, width = _size_pair(vision.patch_size)
        channels = next(getattr(vision, n) for n in ("in_channels", "in_chans", "num_channels") if hasattr(vision, n))
        patch = channels * int(getattr(vision, "temporal_patch_size", 1)) * height * width
        return {"pixel_values": torch.zeros(merge * merge, patch, dtype=dtype, device=device),
                "image_grid_thw": torch.tensor([[1, merge, merge]], device=device)}
    height, width = _size_pair(vision.image_size)
    return {"pixel_values": torch.zeros(1, int(vision.num_channels), height, width, dtype=dtype, device=device)}


def _features(output) -> list:
    """The tensors get_image_features hands the language model: its pooler_output (one tensor or one per image)."""
    import torch

    found = getattr(output, "pooler_output", output)
    if torch.is_tensor(found):
        return [found]
    return [t for t in found if torch.is_tensor(t)]


def exact_zero_from(features: list):
    """A -0.0 scalar on the graph of ``features``: x + (-0.0) is x, bit for bit, for every x (+0.0 would turn a -0.0
    into +0.0), and every gradient it sends back is zero, even where a feature is inf or NaN."""
    total = sum(t.float().sum() for t in features)
    return -(total * 0.0).nan_to_num(0.0, 0.0, 0.0).abs()


def vision_tower_name(model, vlm) -> str:
    """The name (in ``model``) of the module built from the vision config, for messages."""
    kind = type(vlm.config.vision_config)
    for name, module in model.named_modules():
        if module is not vlm and type(getattr(module, "config", None)) is kind:
            return name
    return "the vision tower"


class VisionInStep:
    """Runs ``vlm``'s vision tower on a dummy input on ranks whose forward has fewer vision passes than another rank's.

    ``exchange(count) -> (lowest, highest)``: the fewest and the most vision passes of any rank in this forward (a
    collective); ``keep``: in training, keep the most passes seen so far in every later forward."""

    def __init__(self, model, vlm, exchange, keep: bool = True):
        self.model, self.vlm, self.exchange, self.keep = model, vlm, exchange, keep
        self.tower = vision_tower_name(model, vlm)
        self.kept = 0  # the most vision passes any rank made in one training forward so far
        self.pending = 0  # dummy passes still to run in this forward, at the input embeddings
        self.broken = None  # why the dummy cannot run (after a failed try), else None
        self.tried = False
        self.dummy_passes = 0
        self.handles = [model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                        vlm.get_input_embeddings().register_forward_hook(self._after_embeddings)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _before_forward(self, module, args, kwargs):
        mine = vision_input_count(kwargs)
        lowest, highest = self.exchange(mine)
        target = highest
        if self.keep and module.training and self.broken is None:
            self.kept = max(self.kept, highest)
            target = self.kept
        self.pending = 0
        if target <= lowest:
            return None  # every rank makes as many vision passes as any other
        if not self.tried:
            self._try_dummy()  # every rank, at the same point: a tower that rejects the dummy fails on all alike
        if self.broken is not None:
            if highest > lowest:
                raise RanksDivergedError(
                    f"ZeRO-3 ranks diverged: some ranks run {self.tower!r} on their images or video in this forward "
                    f"and others have none (vision passes per rank: {lowest} to {highest}), and hf_zero could not run "
                    f"{self.tower!r} on a dummy input to keep the others in step ({self.broken}). Fix: a vision config "
                    "that sizes the tower's input as the tower takes it (image_size, num_channels; patch_size, "
                    "temporal_patch_size, spatial_merge_size for flattened patches), or batches whose modalities "
                    "match across ranks (a sampler that groups them).")
            return None  # every rank without vision input: nothing to pad, as without keep
        self.pending = target - mine
        return None

    def _try_dummy(self) -> None:
        import torch

        self.tried = True
        try:
            with torch.no_grad():
                _features(self._run_dummy())
        except Exception as e:  # whatever the tower raises: the run goes on without the dummy, and says so
            self.broken = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            logger.warning("hf_zero: could not run the vision tower %r on a dummy input (%s); ranks whose batches "
                           "have no images cannot keep in step with ranks that have some.", self.tower, self.broken)

    def _run_dummy(self, like=None):
        if like is None:
            # parameters() reads ZeRO-3's parameter dict without indexing it: ``module.weight`` inside a forward
            # would gather the weight on this rank alone (DeepSpeed's external-parameter fetch)
            like = next(self.vlm.get_input_embeddings().parameters())
        return self.vlm.get_image_features(**dummy_vision_input(self.vlm, like.dtype, like.device), return_dict=True)

    def _after_embeddings(self, module, args, output):
        passes, self.pending = self.pending, 0
        if not passes:
            return None
        features = []
        for _ in range(passes):
            features += _features(self._run_dummy(like=output))
        self.dummy_passes += passes
        return output + exact_zero_from(features).to(output.dtype)


def _exchange_over(group):
    def exchange(count: int) -> tuple[int, int]:
        import torch
        import torch.distributed as dist

        both = torch.tensor([count, -count], dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        return -int(both[1]), int(both[0])
    return exchange


def keep_vision_in_step(engine, mode: str = "keep") -> VisionInStep | None:
    """Start a VisionInStep on a built ZeRO-3 engine whose model has a vision tower, on several real ranks; None
    where nothing can diverge (one rank, another stage, no vision tower, ``mode`` "off"), where the forward is
    compiled whole (a host collective in a hook would break the graph), or where one is on already."""
    if mode == "off" or not zero3_on_several_ranks(engine):
        return None
    if compiled_whole(engine):
        return None
    model = engine.module
    vlm = vision_language_model(model)
    if vlm is None or getattr(model, "_hf_zero_vision_in_step", None) is not None:
        return None
    # gloo on the host, even beside NCCL: the count needs no GPU tensor and no GPU synchronization
    group = host_group(WAIT_S)
    step = VisionInStep(model, vlm, _exchange_over(group), keep=mode == "keep")
    model._hf_zero_vision_in_step = step  # a second train() (or prepare) on the same model keeps this one
    return step
