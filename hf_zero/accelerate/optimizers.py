"""The optimizer of a user's Accelerate loop against the preset's config: a DummyOptim gets DeepSpeed's AdamW with its
values, a torch Adam/AdamW configures the config's optimizer block, the "auto" betas/eps Accelerate leaves are filled."""

import logging

from ..config.findings import TRAINER_AUTO_KEYS
from ..config.live import fill_adam_hyperparameters

logger = logging.getLogger("hf_zero")


def deepspeed_adamw_for(config: dict, optimizer) -> str | None:
    """A DummyOptim asks for the config's DeepSpeed optimizer. The presets name none (so that a torch optimizer works
    in Accelerate's loop and the Trainer picks its own), and Accelerate refuses a DummyOptim without one: give the
    config DeepSpeed's AdamW with the DummyOptim's values (torch's betas/eps when it names none). Returns a note, or
    None when the config already has an optimizer block."""
    if "optimizer" in config:
        return None
    extra = optimizer.kwargs
    params = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay,
              "betas": list(extra.get("betas") or TRAINER_AUTO_KEYS["optimizer.params.betas"]),
              "eps": extra.get("eps") or TRAINER_AUTO_KEYS["optimizer.params.eps"]}
    config["optimizer"] = {"type": "AdamW", "params": params}
    return f"DummyOptim: DeepSpeed's AdamW with {params} (the config names no optimizer)"


def with_preset_optimizer(config: dict, optimizer):
    """A DummyOptim (or, for a torch Adam/AdamW, one with its hyperparameters) for the config's optimizer block, with
    the "auto" betas/eps Accelerate does not fill taken from it (torch's AdamW defaults when it names none)."""
    import torch
    from accelerate.utils import DummyOptim

    if optimizer is None:
        return optimizer
    if "optimizer" not in config:
        # a torch optimizer goes to DeepSpeed as it is (Accelerate swaps it for DeepSpeedCPUAdam under offload)
        if isinstance(optimizer, DummyOptim):
            note = deepspeed_adamw_for(config, optimizer)
            logger.info("hf_zero: %s", note)
        return optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            return optimizer  # the optimizer-type check refuses it unless skipped; then Accelerate says what it thinks
        defaults = optimizer.defaults
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optimizer = DummyOptim(params, lr=defaults["lr"], weight_decay=defaults.get("weight_decay", 0.0),
                               betas=defaults.get("betas"), eps=defaults.get("eps"))
    if isinstance(optimizer, DummyOptim):
        extra = optimizer.kwargs
        for note in fill_adam_hyperparameters(config, betas=extra.get("betas") or TRAINER_AUTO_KEYS["optimizer.params.betas"],
                                              eps=extra.get("eps") or TRAINER_AUTO_KEYS["optimizer.params.eps"]):
            logger.info("hf_zero: %s", note)
    return optimizer
