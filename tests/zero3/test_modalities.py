"""The vision dummy on one process, without DeepSpeed: what it adds to a text-only rank's loss and gradients (nothing
but exact zeros), when it runs, and a vision tower that cannot take it (the two-rank runs under ZeRO-3 are in
tests/multiproc/test_vision_in_step.py). ``exchange`` stands in for the ranks' all_reduce: it answers what the other
ranks' batches hold."""

import logging

import pytest
import torch

import hf_zero
from hf_zero.zero3.modalities import (VisionInStep, keep_vision_in_step, vision_in_step_problem,
                                      vision_language_model)
from tiny_vlm import FAMILIES, build, collate, sample


def test_option_values():
    assert all(vision_in_step_problem(v) is None for v in ("keep", "per_step", "off"))
    assert "must be one of" in vision_in_step_problem("always") and "Fix:" in vision_in_step_problem(True)
    with pytest.raises(hf_zero.ConfigError, match="vision_in_step must be one of"):
        hf_zero.ZeroCallback(vision_in_step="on")


def test_nothing_runs_without_other_ranks():
    assert keep_vision_in_step(object(), "keep") is None  # no process group: every rank is this one


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_text_rank_keeps_its_loss_and_gradients_bitwise(family):
    model = build(family).train()
    batch = collate([sample(family, image=False, seed=s) for s in (1, 2)])
    _, image_grads = _loss_and_grads(model, collate([sample(family, image=True, seed=3)]))
    loss, grads = _loss_and_grads(model, batch)
    vlm = vision_language_model(model)
    step = VisionInStep(model, vlm, exchange=lambda mine: (mine, 1))  # another rank has an image
    padded_loss, padded_grads = _loss_and_grads(model, batch)
    assert step.dummy_passes == 1 and step.tower in ("model.visual", "model.vision_tower")
    # the same bits (the models train in fp32) on any CPU: the dummy pass adds exact zeros to the same computation
    assert padded_loss.view(torch.int32).equal(loss.view(torch.int32))
    vision = {name for name in grads if grads[name] is None and image_grads[name] is not None}
    assert vision and all(name.startswith((step.tower, "model.multi_modal_projector")) for name in vision)
    for name, grad in padded_grads.items():
        if name in vision:
            # the vision path an image rank's backward reaches (LLaVA's last CLIP layer feeds nothing, its projector
            # does) is reached by the dummy too, so both ranks reduce-scatter the same gradients: here zeros
            assert grad is not None and not grad.any(), name  # (NaN counts as nonzero)
        elif grads[name] is None:
            assert grad is None, name
        else:
            assert torch.equal(grad, grads[name]), name


def test_quiet_when_every_rank_has_the_same_passes():
    model = build("qwen2_vl").train()
    step = VisionInStep(model, vision_language_model(model), exchange=lambda mine: (mine, mine))
    model(**collate([sample("qwen2_vl", image=False, seed=1)]))
    model(**collate([sample("qwen2_vl", image=True, seed=1)]))
    assert step.dummy_passes == 0


def _counting_exchange(answers):
    """Answers (lowest, highest) from a list, one forward at a time."""
    answers = list(answers)
    return lambda mine: answers.pop(0)


@pytest.mark.parametrize("keep, expected", [(True, 2), (False, 0)])
def test_keep_goes_on_running_the_tower_after_a_vision_step(keep, expected):
    model = build("llava").train()
    # forward 1: every rank has one image; forwards 2 and 3: every rank is text only
    step = VisionInStep(model, vision_language_model(model), _counting_exchange([(1, 1), (0, 0), (0, 0)]), keep=keep)
    model(**collate([sample("llava", image=True, seed=1)]))
    for seed in (2, 3):
        model(**collate([sample("llava", image=False, seed=seed)]))
    assert step.dummy_passes == expected


def test_a_rank_with_fewer_passes_runs_the_difference():
    model = build("qwen2_vl").train()
    step = VisionInStep(model, vision_language_model(model), exchange=lambda mine: (mine, 2))  # image + video elsewhere
    model(**collate([sample("qwen2_vl", image=True, seed=1)]))
    assert step.dummy_passes == 1


def test_a_tower_that_rejects_the_dummy_stops_naming_it(caplog):
    model = build("llava").train()
    model.config.vision_config.image_size = 7  # the dummy follows the config; CLIP takes only its own 16x16
    step = VisionInStep(model, vision_language_model(model), exchange=lambda mine: (0, 1))
    text = collate([sample("llava", image=False, seed=1)])
    with caplog.at_level(logging.WARNING, logger="hf_zero"), pytest.raises(hf_zero.RanksDivergedError) as stop:
        model(**text)
    message = str(stop.value)
    assert "'model.vision_tower'" in message and "dummy input" in message and "Fix:" in message
    with caplog.at_level(logging.WARNING, logger="hf_zero"), pytest.raises(hf_zero.RanksDivergedError):
        model(**text)
    warned = [r for r in caplog.records if "could not run the vision tower" in r.getMessage()]
    assert len(warned) == 1 and "doesn't match" in warned[0].getMessage()
    # ranks that agree (none with vision input) train on without it
    step.exchange = lambda mine: (0, 0)
    assert model(**text).loss.isfinite()
