"""Activations: what the forward keeps for the backward on each GPU, per token, under DeepSpeed and under the
plain Trainer."""

from .shapes import ModelShape, RunShape

# Activations of the 1.35B model, seq 1024 (snapshots): 10.07 GiB at micro batch 4, 3.80 GiB at 8 with
# checkpointing; two equations, two constants.
ACTIVATION_SCALE = 1.093  # calibrated: bytes saved per token per layer, as a share of 22h + 8i (16-bit)
LOGIT_BYTES = 9.45  # calibrated: bytes per token per vocabulary entry (16-bit logits, fp32 loss input, its gradient)
COMPILED_ACTIVATIONS = 0.73  # calibrated: torch.compile (regional) fuses norms and SwiGLU (zero2 0.72, zero3 0.74)
# A Llama-style decoder layer's Linear layers, grouped by the input they read. A frozen Linear keeps no
# input for its backward (it has no weight gradient), so a group's input is freed unless an adapter in it
# keeps it; o_proj's input is the attention's output, which the attention keeps for its own backward.
LLAMA_INPUT_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
KEPT_BY_ATTENTION = ("o_proj",)
LLAMA_NORMS = 2  # RMSNorms per layer: trainable, each keeps its normalized input for the weight's gradient
# The plain Trainer (DDP or one process) with bf16 autocasts a model kept in fp32; the terms below are the tensors
# it holds per token. Measured on one H200 (1.35B: hidden 2048, 24 layers, vocab 32000; gradient checkpointing,
# micro batch 1): 25.92, 52.04, 88.79, 125.55 GiB at seq 16k, 64k, 128k, 192k; counted per token (602,112 bytes
# at the logits' backward) the plan is within 1% of each.
# - log_softmax's fp32 output (saved for its backward), nll_loss's fp32 gradient of it, and log_softmax's fp32
#   gradient of the logits: three seq x vocab fp32 tensors alive together when the backward starts;
LOGITS_BACKWARD = 3 * 4
# - in the forward: the 16-bit logits, the fp32 upcast transformers' loss makes (as log_softmax's input, then
#   Accelerate's convert_outputs_to_fp32 copy of the returned logits) and log_softmax's saved fp32 output.
LOGITS_FORWARD_FP32 = 2 * 4
# TRL's fused LM head (trl/kernels/chunked_logprob.py): per token, fp32 running statistics of the online
# logsumexp (max, sum of exp, target logit, log_z, log-prob and the optional entropy sums); per call, one
# TOKEN_CHUNK_SIZE x chunk tile of logits in the compute dtype.
FUSED_LOSS_FP32_PER_TOKEN = 10
FUSED_LOSS_TILE = (4096, 32768)  # trl's TOKEN_CHUNK_SIZE and _CHUNKED_LOGPROB_CHUNK_SIZE


def logit_bytes(model: ModelShape, run: RunShape) -> int:
    """What the loss holds on each GPU at the backward's peak under DeepSpeed (a 16-bit model, calibrated)."""
    if "fused_loss" in run.long_context:
        return fused_loss_bytes(model, run, run.element_bytes, run.element_bytes)
    width = run.element_bytes
    return int(run.tokens() * model.vocab * LOGIT_BYTES * width / 2)


def fused_loss_bytes(model: ModelShape, run: RunShape, residual: int, compute: int, tokens: int | None = None,
                     backward: bool = True) -> int:
    """TRL's fused LM head on each GPU. Forward: per labelled token a copy of its hidden state (``residual`` bytes
    wide, saved for the backward) and the fp32 per-token statistics; once, the logits tile and the head's weight in
    the compute dtype. Backward adds, per token, the fp32 gradient of the hidden state the kernel accumulates and
    that gradient cast back to the hidden state's dtype; once, the head weight's fp32 gradient."""
    tokens = run.tokens() if tokens is None else tokens
    h = model.hidden
    per_token = h * residual + 4 * FUSED_LOSS_FP32_PER_TOKEN
    once = min(tokens, FUSED_LOSS_TILE[0]) * FUSED_LOSS_TILE[1] * compute + model.vocab * h * compute
    if backward:
        per_token += 4 * h + (h * residual if residual != 4 else 0)
        once += model.vocab * h * 4
    return tokens * per_token + once


def tiled_mlp_saving(model: ModelShape, run: RunShape) -> float:
    """Bytes per token per layer that TiledMLP keeps less: the MLP's four intermediates (gate and up projections,
    the activation of gate, its product with up; intermediate-wide, 16-bit), which exist for one shard at a time
    (``tiled_mlp_shard_bytes``). Its saved input is the norm's output, which gate/up kept anyway; its backward
    adds one hidden-wide gradient buffer (``torch.zeros_like(x)``) for the layer being differentiated."""
    if "tiled_mlp" not in run.long_context:
        return 0
    return ACTIVATION_SCALE * 8 * model.intermediate * run.element_bytes / 2 - model.hidden * run.element_bytes


def tiled_mlp_shard_bytes(model: ModelShape, run: RunShape, compute: int) -> int:
    """One TiledMLP shard in backward: its four intermediates recomputed with autograd, and their gradients.
    DeepSpeed cuts the sequence into ceil(seq / hidden) shards, so a shard holds about ``hidden`` tokens."""
    if "tiled_mlp" not in run.long_context:
        return 0
    seq = run.tokens() // run.micro_batch
    shards = -(-seq // model.hidden)
    shard_tokens = -(-seq // shards) * run.micro_batch
    return 2 * 4 * model.intermediate * compute * shard_tokens


def layer_bytes_per_token(model: ModelShape, run: RunShape, zero3: bool) -> float:
    """What one decoder layer keeps for its backward per token (16-bit model; calibrated, see ACTIVATION_SCALE)."""
    per_layer_token = ACTIVATION_SCALE * (22 * model.hidden + 8 * model.intermediate) * run.element_bytes / 2
    if run.lora_r:
        per_layer_token -= frozen_base_saving(model, run, zero3)
    if run.compiled:
        per_layer_token *= COMPILED_ACTIVATIONS
    return per_layer_token - tiled_mlp_saving(model, run)


def frozen_base_saving(model: ModelShape, run: RunShape, zero3: bool) -> int:
    """Bytes per token per layer that a LoRA run's frozen layers save less (negative: more) than full
    fine-tuning. Counted for Llama-style layers; other architectures are planned as full fine-tuning.
    - A frozen Linear keeps no input, unless an adapter in its input group keeps it. Not under eager
      ZeRO-3: DeepSpeed's Linear keeps every input (torch's is restored when blocks are compiled).
    - A frozen RMSNorm keeps no normalized input (it needs none for the input's gradient).
    - Under ZeRO-3 without ZeroCallback the adapters stay fp32: each adapted Linear keeps an fp32 copy of its
      input instead (``RunShape.fp32_adapters``; the callback casts them to the base's 16 bits).
    - Each adapter keeps its r-wide inner activation."""
    width = run.element_bytes
    targets = set(model.lora_targets(run.lora_targets))
    if set(model.linears) != {name for group in LLAMA_INPUT_GROUPS for name in group}:
        return 0
    saved = LLAMA_NORMS * model.hidden * width
    deepspeed_linear = zero3 and not run.compiled
    fp32_adapters = zero3 and run.fp32_adapters and width < 4
    for group in LLAMA_INPUT_GROUPS:
        inputs = model.linears[group[0]][0]
        adapted = targets.intersection(group)
        if fp32_adapters:
            saved -= 4 * inputs * len(adapted)  # each adapted Linear's fp32 copy of its input
        saved -= run.lora_r * (4 if fp32_adapters else width) * len(adapted)  # lora_A's output, for lora_B's gradient
        keeps_16_bit_input = deepspeed_linear or group[0] in KEPT_BY_ATTENTION or (adapted and not fp32_adapters)
        if not keeps_16_bit_input:
            saved += inputs * width
    return saved


def activation_bytes(model: ModelShape, run: RunShape, zero3: bool = False) -> int:
    """Everything the forward keeps for the backward on each GPU under DeepSpeed, the loss included.
    With gradient checkpointing each layer's input is kept (on the host with offload_activations, where the GPU
    holds the one layer's input being brought back) and one layer at a time is recomputed with its full
    activations; Ulysses splits every term over the sequence-parallel group."""
    tokens = run.tokens()
    width = run.element_bytes
    per_layer_token = layer_bytes_per_token(model, run, zero3)
    if run.checkpointing:
        inputs = 1 if "offload_activations" in run.long_context else model.layers
        kept = tokens * inputs * model.hidden * width + tokens * per_layer_token
    else:
        kept = tokens * model.layers * per_layer_token
    return int(kept) + tiled_mlp_shard_bytes(model, run, width) + logit_bytes(model, run)


def plain_activation_phases(model: ModelShape, run: RunShape) -> dict:
    """Moment of the step -> GPU bytes of the plain Trainer's activations (no DeepSpeed; Ulysses needs DeepSpeed,
    so each GPU holds the whole sequence). With bf16 or fp16 it autocasts a model kept in fp32: the residual
    stream (the embeddings, every layer's input and output, the norms) is fp32, the matmuls' outputs 16-bit.

    - loss: the forward ends inside autocast: the logits in three forms (LOGITS_FORWARD_FP32), and the final norm's
      output still referenced by the model's output;
    - backward: the loss's backward, three fp32 seq x vocab tensors (LOGITS_BACKWARD); the peak at long sequences
      unless the loss is fused;
    - recompute: the first checkpointed layer recomputed, with its full activations and the gradient of its output.
    Each holds the checkpointed inputs (or, without checkpointing, every layer's activations) and the final norm's."""
    tokens = run.tokens(sequence_parallel=False)
    h = model.hidden
    autocast = run.dtype in ("bf16", "fp16")
    residual, compute = 4, (2 if autocast else 4)
    # one layer's activations: the 16-bit count, plus the two norms' outputs kept in fp32 (4h instead of 2h each)
    layer = layer_bytes_per_token(model, run, zero3=False) + (2 * LLAMA_NORMS * h if autocast else 0)
    rotary = 2 * model.head_dim * residual  # cos and sin, computed once and shared by every layer
    offload = "offload_activations" in run.long_context
    if run.checkpointing:
        # each layer's saved input, fp32 (on the host with offload_activations)
        kept = (0 if offload else model.layers * h * residual) + rotary
    else:
        kept = model.layers * layer + rotary
    # the final norm: its fp32 input (its pow and mul save it), the normalized fp32 tensor (saved by the weight's
    # mul) and the LM head's 16-bit cast of its output
    kept += 4 * h + residual * h + compute * h
    shard = tiled_mlp_shard_bytes(model, run, compute)
    # the first recompute: the layer's input back from the host (offload), its activations, the gradient of its
    # output (fp32, as the residual stream) and, without TiledMLP, two intermediate-wide 16-bit gradients inside its
    # MLP's backward (of the product and of one of its factors; with TiledMLP they are the shard's)
    mlp_grads = 0 if "tiled_mlp" in run.long_context else 2 * model.intermediate * compute
    recompute = (h * residual if offload else 0) + layer + h * residual + mlp_grads
    if "fused_loss" in run.long_context:
        loss = {"loss": fused_loss_bytes(model, run, residual, compute, tokens, backward=False) + tokens * residual * h,
                "backward": fused_loss_bytes(model, run, residual, compute, tokens)}
    else:
        head = model.vocab * h * compute if autocast else 0  # the LM head's 16-bit weight, saved for its backward
        loss = {"loss": tokens * model.vocab * (compute + LOGITS_FORWARD_FP32) + tokens * residual * h,
                "backward": tokens * model.vocab * LOGITS_BACKWARD + head}
    phases = {moment: int(tokens * kept + extra) for moment, extra in loss.items()}
    if run.checkpointing:
        phases["recompute"] = int(tokens * (kept + recompute)) + shard
    return phases


