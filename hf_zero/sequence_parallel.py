"""Ulysses sequence parallelism (DeepSpeed ALST, switched on by Accelerate's ParallelismConfig(sp_backend="deepspeed",
sp_size=N) and run by the Trainer): what a run needs before its first step.

DeepSpeed refuses most of these itself, but late: the attention and batch-size mismatches when it builds the engine
(after the model is loaded), the sequence length at the first batch, and on CPU an SP x DP layout only in the first
backward. Each problem here is one line with the fix.
"""

import logging

from .errors import ConfigError

logger = logging.getLogger("hf_zero")


def active_parallelism_config(accelerator=None, args=None):
    """The ParallelismConfig the run uses: the Accelerator holds it (the Trainer's, from TrainingArguments(
    parallelism_config=...) or, under ``accelerate launch`` with a parallelism_config block, from the environment; or
    the one a loop built); else the arguments' own."""
    config = getattr(accelerator, "parallelism_config", None)
    return config if config is not None else getattr(args, "parallelism_config", None)


def _text_config(model_config):
    get = getattr(model_config, "get_text_config", None)
    return get() if callable(get) else model_config


def attention_problems(model_config, parallelism_config) -> list:
    """DeepSpeed's Ulysses wraps the attention function the model calls, named by the SP handler's
    sp_attn_implementation; the two must be the same, and one Accelerate accepts (not eager: its 4D mask is
    dropped under SP)."""
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    model_attention = getattr(model_config, "_attn_implementation", None)
    handler = getattr(parallelism_config, "sp_handler", None)
    asked = getattr(handler, "sp_attn_implementation", None)
    try:  # Accelerate's own list of what Ulysses runs
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation=model_attention)
        supported = model_attention is not None
    except ValueError:
        supported = False
    if not supported:
        return [f"the model runs attn_implementation={model_attention!r}, which Ulysses sequence parallelism does not "
                "support (it drops the 4D attention mask and needs an attention that is causal without it). Fix: load "
                "the model with attn_implementation=\"sdpa\" (or \"flash_attention_2\" on GPUs) and set "
                "DeepSpeedSequenceParallelConfig(sp_attn_implementation=...) to the same."]
    if asked != model_attention:
        return [f"the sequence-parallel handler's sp_attn_implementation is {asked!r} but the model runs "
                f"{model_attention!r}: DeepSpeed refuses to build the engine (core_attn_implementation does not match). "
                f"Fix: ParallelismConfig(sp_backend=\"deepspeed\", sp_size=N, sp_handler=DeepSpeedSequenceParallelConfig("
                f"sp_attn_implementation={model_attention!r})) (accelerate config: "
                f"parallelism_config_sp_attn_implementation: {model_attention})."]
    return []


def replica_problems(parallelism_config, launched: int, sp: int) -> list:
    """Accelerate sizes the engine's train_batch_size over dp_replicate_size x dp_shard_size replicas, DeepSpeed
    checks it against world / sp_size: the two must agree (with SP the ParallelismConfig does not fill them in)."""
    if launched % sp:
        return []  # layout_problems says the world does not divide
    replicas = (getattr(parallelism_config, "dp_replicate_size", 1) or 1) * (getattr(parallelism_config, "dp_shard_size", 1) or 1)
    if replicas * sp == launched:
        return []
    return [f"ParallelismConfig(sp_size={sp}) on {launched} processes has dp_replicate_size x dp_shard_size = {replicas}, "
            f"not {launched} / {sp} = {launched // sp}: Accelerate sizes DeepSpeed's train_batch_size for {replicas} "
            f"replica(s) and the engine refuses it (Check batch related parameters). Fix: "
            f"ParallelismConfig(sp_backend=\"deepspeed\", sp_size={sp}, dp_replicate_size={launched // sp}, ...) "
            f"(accelerate config: parallelism_config_dp_replicate_size: {launched // sp})."]


def gloo_subgroup_problems(launched: int, sp: int, on_cpu: bool) -> list:
    """On CPU (gloo) the Trainer's SP loss (transformers' deepspeed_sp_compute_loss) all-gathers the per-rank losses
    with torch.distributed.nn.functional.all_gather, whose gloo backward scatters from group ranks as if they were
    global ranks: in an SP group that is not the whole world it raises ValueError: Global rank 0 is not part of group."""
    if not on_cpu or sp <= 1 or sp >= launched or launched % sp:
        return []
    return [f"sequence parallel {sp} on {launched} CPU processes makes {launched // sp} SP groups, and on gloo the "
            "Trainer's SP loss fails in the first backward (torch's all_gather backward on gloo: 'Global rank 0 is "
            f"not part of group'). Fix: on CPU use sp_size={launched} (one SP group over every process), or train "
            "on GPUs (NCCL)."]


def sequence_parallel_problems(model, parallelism_config, launched: int, sp: int, *, on_cpu: bool) -> list:
    """Everything a Ulysses run needs from the model and the ParallelismConfig, as lines; [] when sp is 1."""
    if sp <= 1:
        return []
    problems = replica_problems(parallelism_config, launched, sp) + gloo_subgroup_problems(launched, sp, on_cpu)
    model_config = getattr(model, "config", None)
    if model_config is not None:
        problems += attention_problems(model_config, parallelism_config)
    return problems


def attention_head_counts(model) -> tuple:
    """(query heads, key/value heads) of the model's text stack, as DeepSpeed's Ulysses reads them; None if unknown."""
    text = _text_config(getattr(model, "config", None))
    heads = getattr(text, "num_attention_heads", None)
    return heads, getattr(text, "num_key_value_heads", None) or heads


class SequenceParallelBatches:
    """The train dataloader's collate function under Ulysses: checks that each batch splits into sp_size equal
    sequence shards, and adds position_ids when the batch has none.

    DeepSpeed's UlyssesSPDataLoaderAdapter needs position_ids in every batch (each shard keeps its global positions;
    the model would otherwise count from 0 on every rank). torch.arange over the batch's width is what the model
    computes itself when it gets no position_ids, so a run trains as it would without SP."""

    def __init__(self, collate, sp: int):
        self.collate, self.sp = collate, sp
        self.filled_positions = False

    def __call__(self, features):
        import torch

        batch = self.collate(features)
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        if not torch.is_tensor(ids) or ids.dim() < 2:
            return batch
        width = ids.shape[1]
        if width % self.sp:
            raise ConfigError(f"a training batch has sequence length {width}, which sequence parallel size {self.sp} "
                              f"does not divide (each rank takes length / {self.sp} tokens). Fix: pad every batch to a "
                              f"multiple of {self.sp}: give the collator pad_to_multiple_of={self.sp}, e.g. "
                              f"DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of={self.sp}).")
        if "position_ids" not in batch:
            batch["position_ids"] = torch.arange(width, device=ids.device).expand(ids.shape[0], -1).clone()
            if not self.filled_positions:
                self.filled_positions = True
                logger.info("hf_zero: the training batches have no position_ids, which Ulysses needs; "
                            "added torch.arange(seq_len) per row (what the model uses without them)")
        return batch


def check_batches_of(trainer, sp: int) -> None:
    """Wrap the collate function of the Trainer's train dataloader (not the eval one: Accelerate turns SP off in
    evaluation) in SequenceParallelBatches."""
    build = trainer.get_train_dataloader
    if getattr(build, "_hf_zero_sp", None) == sp:
        return

    def get_train_dataloader(*args, **kwargs):
        loader = build(*args, **kwargs)
        check_loader_batches(loader, sp)
        return loader

    get_train_dataloader._hf_zero_sp = sp
    trainer.get_train_dataloader = get_train_dataloader


def check_loader_batches(loader, sp: int) -> None:
    """Wrap a training DataLoader's collate function in SequenceParallelBatches (once)."""
    # Accelerate's DataLoaderShard reads attributes through to the DataLoader it wraps, but sets them on itself
    inner = getattr(loader, "base_dataloader", loader)
    if not isinstance(inner.collate_fn, SequenceParallelBatches):
        inner.collate_fn = SequenceParallelBatches(inner.collate_fn, sp)


def loss_over_sequence_shards(engine, accelerator) -> str | None:
    """Under Ulysses in a user's Accelerate loop, make ``engine(**batch).loss`` the loss the Trainer trains on.

    DeepSpeed's dataloader adapter gives each rank a shard of every sequence, with ``shift_labels`` in place of
    ``labels``, so the model alone returns no loss; Accelerate's sequence-parallelism guide asks each loop to gather
    the shards' losses itself. transformers' own function for the Trainer does it (weighted by each shard's tokens,
    with the gradient scaling of the installed DeepSpeed); the engine's forward calls it for training batches that
    carry ``shift_labels`` and no ``labels``. Returns a note when transformers lacks it, else None."""
    from .compat.hf_api import sequence_parallel_loss

    compute = sequence_parallel_loss()
    if compute is None:
        return ("this transformers has no sequence-parallel loss (deepspeed_sp_compute_loss): the loop's model returns "
                "no loss under Ulysses. Fix: upgrade transformers, or gather the shards' losses as Accelerate's "
                "sequence-parallelism guide shows.")
    forward = engine.forward
    if getattr(forward, "hf_zero_sp_loss", False):
        return None

    def forward_with_sequence_loss(*args, **inputs):
        if args or not engine.training or "shift_labels" not in inputs or "labels" in inputs:
            return forward(*args, **inputs)
        # the adapter slices each row of a batch: with 2+ rows a shard is not contiguous, and the loss views it flat
        inputs["shift_labels"] = inputs["shift_labels"].contiguous()
        loss, outputs = compute(accelerator, forward, inputs, True, accelerator.parallelism_config)
        outputs["loss"] = loss
        return outputs

    forward_with_sequence_loss.hf_zero_sp_loss = True
    engine.forward = forward_with_sequence_loss  # an instance attribute: nn.Module.__call__ finds it first
    return None
