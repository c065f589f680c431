"""Load a model partitioned across ranks (zero.Init), never whole on every rank."""

import contextlib

from ..config.dotted import zero_stage
from ..config.findings import fill_auto
from ..config.presets import load_config
from ..distributed import init_distributed, world_size

_kept_config = None  # a strong reference: HF only holds the DeepSpeed config through a weakref


def _dtype_name(dtype) -> str | None:
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)


@contextlib.contextmanager
def zero3_init(config="zero3", *, dtype=None, nvme_path=None, keep=False):
    """Inside this block, ``from_pretrained`` / ``from_config`` build stage-3 models partitioned.

    Works before TrainingArguments exists and with "auto" values in the config (HF's own
    HfDeepSpeedConfig fails on "auto" batch sizes). ``dtype`` (torch.bfloat16 / float16) is
    the dtype training will use. On leaving, the global HF DeepSpeed config is removed unless
    ``keep=True``: while it is alive every later ``from_pretrained`` enters zero.Init, a
    collective, and a reload on one rank hangs.
    """
    global _kept_config
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    resolved = load_config(config, nvme_path=nvme_path)
    if zero_stage(resolved) != 3:
        raise ValueError("zero3_init needs a stage-3 config (zero3, zero3_offload, zero3_nvme); "
                         "stages 1 and 2 keep whole parameters on every rank.")
    init_distributed()
    hf_config = HfDeepSpeedConfig(fill_auto(resolved, world_size=world_size(), dtype=_dtype_name(dtype)))
    try:
        yield hf_config
    finally:
        if keep:
            _kept_config = hf_config
        else:
            unset_hf_deepspeed_config()


def from_pretrained(model_class, path, config="zero3", *, keep_config=False, nvme_path=None, **kwargs):
    """``model_class.from_pretrained(path, **kwargs)`` partitioned by zero.Init under stage 3.

    ``config`` is a preset name, JSON path or dict. For stages 1 and 2 this is a plain
    ``from_pretrained``. Example::

        model = hf_zero.from_pretrained(AutoModelForCausalLM, "path/to/model", "zero3", dtype=torch.bfloat16)
    """
    resolved = load_config(config, nvme_path=nvme_path)
    if zero_stage(resolved) != 3:
        return model_class.from_pretrained(path, **kwargs)
    with zero3_init(resolved, dtype=kwargs.get("dtype"), keep=keep_config):
        return model_class.from_pretrained(path, **kwargs)


def release_zero3_config() -> None:
    """Drop the HF DeepSpeed config kept alive by ``keep=True`` / a Trainer run (e.g. before a reload)."""
    global _kept_config
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    _kept_config = None
    unset_hf_deepspeed_config()


@contextlib.contextmanager
def zero3_init_paused():
    """Build models whole inside this block even while a stage-3 config is alive.

    For models that must not be partitioned, e.g. one built on the meta device by one rank to
    read shapes: zero.Init is a collective, and entering it on one rank deadlocks the others.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref  # transformers keeps it only as this module global
    live = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if live is not None:
            hf_deepspeed.set_hf_deepspeed_config(live)
