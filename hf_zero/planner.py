"""ZeRO-aware per-GPU memory model: which setup fits a model on given GPUs, and why the others do not.

A training step peaks in one of two phases, and the plan is the larger of them:
- backward: the loss is computed and backward starts. Every activation is alive; ZeRO-1/2 hold no
  gradients yet (set to None after the last step, then reduced into partitions bucket by bucket).
  When the first gradients are reduced, the loss and logits are freed and the reduce buckets
  allocated; for the presets that overlap communication (two buckets) that moment is the peak.
- optimizer step: the activations are gone; DeepSpeed turns the 16-bit gradient partition into an
  fp32 one, one ZeRO-3 sub-group at a time. It is the peak when activations are small next to the
  model states (8B on 2 GPUs with checkpointing: 54.95 GiB of states + 5.69 GiB of that copy).

Bytes per parameter Psi (bf16 mixed precision, Adam), N = data-parallel ranks over all nodes, as a
memory snapshot of the peak showed them (``the benchmark harness --memory-snapshot`` and ``--simulate-ranks``):

    setup          backward phase, on each GPU                        in host memory / on NVMe
    DDP            12 (fp32 weights, Adam; the gradients come in the backward, 16 at the step)
                   + 4 (DDP's gradient buckets, when N > 1) + autocast's 16-bit weight copies
    zero1, zero2   2 (16-bit weights) + 12/N (fp32 master, Adam m, v)
    zero2_offload  2 + the reduce buckets + 4/N (fp32 gradient partition)  16/N per rank
    zero3          16/N (2 + 2 + 12: 16-bit weight and gradient partitions, fp32 states)
                   + the reduce bucket, allocated at init
                   + gathered parameters, when N > 1: up to stage3_max_live_parameters of them
                     stay gathered from the forward into the backward (1.91 GiB at 1e9)
    zero3_offload  the reduce bucket + gathered parameters              18/N per rank
    zero3_nvme     as zero3_offload                                     18/N per rank on NVMe

ZeRO-3's peak above its states does not fall with N (12.2 GiB for 1.35B at N = 2, 4 and 8), which is
why an N-free term belongs here: a model of 18/N with no gathered term fitted 2 GPUs and was 22-29%
under at 8. Activations follow the model's shapes (hidden h, intermediate i, layers, vocab) per token;
with gradient checkpointing only each layer's input is kept, plus one layer being recomputed;
torch.compile's fused layers keep fewer of them. The plain Trainer (DDP or one process) autocasts an fp32 model,
so its residual stream is fp32 and its loss holds fp32 logits: its activations are counted tensor by tensor
(``plain_activation_phases``) at three moments of the step, and the longest sequence it fits matches the one
measured. hf_zero's long-context parts (LONG_CONTEXT_PARTS) and Ulysses sequence parallelism change the per-token
terms; ``longest_sequence`` bisects over the same estimate. The constants marked "calibrated" were fitted to
memory snapshots of the 1.35B model on H200s (benchmarks): tests/test_planner.py holds
every measured peak (1.35B and 7.2B, N = 1 to 8) to +-15%. The optimizer-step bytes are also checked
on CPU, where they are countable: tests/test_zero_training.py counts every live tensor just before
DeepSpeed's optimizer step.

LoRA (``RunShape.lora_r``): the base is frozen, so gradients and optimizer states are the adapter's
alone, and a frozen layer saves less for its backward (counted in ``frozen_base_saving``, checked
on CPU by tests/test_planner.py). Left alone, ZeRO-3 trains peft's adapters in fp32 (DeepSpeed
partitions them as they are) and peft keeps an fp32 copy of each adapted layer's input for the
backward: 6.52 GiB with LoRA on every Linear of the 1.35B model (``--simulate-ranks``). ZeroCallback
casts the adapters to the base's 16 bits, as ZeRO-1/2 train them; ``RunShape.fp32_adapters`` plans
a run without that cast.
"""

from dataclasses import asdict, dataclass, field, replace

from .zero3.moe import active_params

GIB = 1024**3
SETUPS = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme")
# Least sharding first, offload only when nothing on the GPUs fits: the first that fits is the fastest.
# Measured on 2x H200, 1.35B (benchmarks/2xH200): zero3 30k tokens/s, zero3_offload 7.5k
# (its Adam step runs on the CPU, as zero2_offload's does).
PREFERENCE = ("ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_nvme")

# Activations of the 1.35B model, seq 1024 (snapshots): 10.07 GiB at micro batch 4, 3.80 GiB at 8 with
# checkpointing; two equations, two constants.
ACTIVATION_SCALE = 1.093  # calibrated: bytes saved per token per layer, as a share of 22h + 8i (16-bit)
LOGIT_BYTES = 9.45  # calibrated: bytes per token per vocabulary entry (16-bit logits, fp32 loss input, its gradient)
COMPILED_ACTIVATIONS = 0.73  # calibrated: torch.compile (regional) fuses norms and SwiGLU (zero2 0.72, zero3 0.74)
SUB_GROUP = 1_000_000_000  # the presets' sub_group_size: ZeRO-3 steps the optimizer one sub-group at a time
MAX_LIVE = 1_000_000_000  # the presets' stage3_max_live_parameters (and max_reuse_distance)
# A Llama-style decoder layer's Linear layers, grouped by the input they read. A frozen Linear keeps no
# input for its backward (it has no weight gradient), so a group's input is freed unless an adapter in it
# keeps it; o_proj's input is the attention's output, which the attention keeps for its own backward.
LLAMA_INPUT_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
KEPT_BY_ATTENTION = ("o_proj",)
LLAMA_NORMS = 2  # RMSNorms per layer: trainable, each keeps its normalized input for the weight's gradient
# Reduce buckets alive at once: two with overlap_comm (DeepSpeed's setup_buckets double-buffers), one without
REDUCE_BUCKETS = {"zero1": 2, "zero2": 1, "zero2_offload": 2}

# hf_zero's long-context switch, each part optional:
# - tiled_mlp: DeepSpeed's TiledMLP runs each decoder layer's MLP on ceil(seq / hidden) sequence shards and
#   recomputes it in backward, so the MLP's seq x intermediate tensors exist for one shard at a time;
# - fused_loss: TRL's fused LM head (add_fused_lm_head) scores the labelled positions in tiles: the seq x vocab
#   logits, their fp32 upcast and their gradient never exist;
# - offload_activations: each checkpointed layer's saved input goes to pinned host memory in the forward and
#   comes back in the backward (it implies gradient checkpointing).
LONG_CONTEXT_PARTS = ("tiled_mlp", "fused_loss", "offload_activations")
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


@dataclass
class ModelShape:
    params: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    largest_layer: int  # parameters of the biggest decoder layer (what ZeRO-3 gathers at once)
    name: str = ""
    linears: dict = field(default_factory=dict)  # Linear leaf name in that layer -> (in_features, out_features)
    model_type: str = ""
    heads: int = 0  # attention heads (Ulysses gives each rank heads / sp of them)
    head_dim: int = 0  # width of one head: the rotary cos/sin are seq x head_dim
    # mixture of experts: parameters one token runs through (all but the routed experts, plus top-k of them; shared
    # experts count whole), None for a dense model; and the same for the largest layer
    active_params: int | None = None
    largest_layer_active: int | None = None

    def param_sizes(self) -> list:
        """Elements of each weight matrix in the model's order: the embedding, the decoder layers' Linears, the LM
        head (norms and biases are left out: they are a few hidden-size vectors)."""
        per_layer = [i * o for i, o in self.linears.values()]
        return [self.vocab * self.hidden] + per_layer * self.layers + [self.vocab * self.hidden]

    @property
    def linear_params(self) -> int:
        """Weights that go through a matmul: the decoder layers' Linear layers and the LM head (what autocast casts)."""
        per_layer = sum(i * o for i, o in self.linears.values())
        return self.layers * per_layer + self.vocab * self.hidden if per_layer else self.params

    @classmethod
    def from_config(cls, config, name=""):
        """Count parameters on the meta device: no weights are read or allocated (70B in about a second)."""
        import torch
        from transformers import AutoModel, AutoModelForCausalLM

        with torch.device("meta"):
            try:
                model = AutoModelForCausalLM.from_config(config)
            except ValueError:  # an encoder or other non-causal architecture
                model = AutoModel.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        blocks = [block for ml in model.modules() if isinstance(ml, torch.nn.ModuleList) for block in ml]
        biggest = max(blocks, key=lambda block: sum(p.numel() for p in block.parameters()), default=None)
        largest = sum(p.numel() for p in biggest.parameters()) if biggest is not None else params
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        top_k = getattr(text, "num_experts_per_tok", None) or getattr(text, "experts_per_token", None) or 1
        active = active_params(model, top_k)
        layer_active = active_params(biggest, top_k) if biggest is not None and active is not None else None
        linears = {} if biggest is None else {
            name.rsplit(".", 1)[-1]: (m.in_features, m.out_features)
            for name, m in biggest.named_modules() if isinstance(m, torch.nn.Linear)}
        hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", 0)
        heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", 0)
        return cls(params=params, hidden=hidden, intermediate=getattr(text, "intermediate_size", None) or 4 * hidden,
                   layers=getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", 0),
                   vocab=getattr(text, "vocab_size", 0), largest_layer=largest, name=name, linears=linears,
                   model_type=getattr(config, "model_type", ""), heads=heads,
                   head_dim=getattr(text, "head_dim", None) or (hidden // heads if heads else 0),
                   active_params=active, largest_layer_active=layer_active)

    def with_layers(self, layers: int) -> "ModelShape":
        """The same model with ``layers`` decoder layers: every layer is a copy of the largest one (a Llama-style
        stack), so the parameters change by that layer's count per layer."""
        added = layers - self.layers
        per_layer = self.largest_layer if self.largest_layer_active is None else self.largest_layer_active
        active = None if self.active_params is None else self.active_params + added * per_layer
        return replace(self, layers=layers, params=self.params + added * self.largest_layer, active_params=active)

    def lora_targets(self, targets) -> list:
        """The Linear leaf names of a decoder layer that ``targets`` (names, or "all-linear") adapts."""
        if targets in ("all-linear", ("all-linear",), ["all-linear"]):
            return sorted(self.linears)
        unknown = sorted(set(targets) - set(self.linears))
        if unknown:
            raise ValueError(f"LoRA target(s) {', '.join(unknown)} are not Linear layers of {self.name or 'the model'}'s "
                             f"decoder layers (those are: {', '.join(sorted(self.linears))})")
        return sorted(targets)

    def adapter_params(self, r: int, targets) -> int:
        """LoRA's trainable parameters: r x (in + out) per adapted Linear, in every decoder layer."""
        return self.layers * sum(r * sum(self.linears[name]) for name in self.lora_targets(targets))


@dataclass
class RunShape:
    gpus_per_node: int = 1
    nodes: int = 1
    seq: int = 1024
    micro_batch: int = 1
    gradient_checkpointing: bool = False
    dtype: str = "bf16"
    compiled: bool = False  # TrainingArguments(torch_compile=True)
    bucket: int = 500_000_000  # reduce / prefetch bucket elements (hf_zero presets)
    lora_r: int = 0  # > 0: a peft LoRA adapter of this rank trains on the frozen model
    lora_targets: tuple = ("all-linear",)  # the decoder layers' Linear names it adapts (peft's target_modules)
    fp32_adapters: bool = False  # ZeRO-3 trains the adapter in fp32 (without ZeroCallback's cast to 16 bits)
    reference_model: bool = False  # a frozen reference copy of the model (TRL's DPO/KTO), none with LoRA
    sequence_parallel: int = 1  # DeepSpeed's Ulysses sp_size: each GPU holds seq / sp tokens of activations
    long_context: tuple = ()  # parts of hf_zero's long-context switch (LONG_CONTEXT_PARTS)
    accumulation: int = 1  # gradient accumulation steps: micro-batches per optimizer step
    # zero2_offload accumulates gradients in an fp32 partition on the GPU (the preset's data_types.grad_accum_dtype);
    # False: DeepSpeed's default, 16-bit buffers per parameter on the host
    fp32_accumulation: bool = True
    # zero3_offload's placement (offload_optimizer.ratio, offload_param, sub_group_size): the share of the
    # optimizer's sub-groups stepped by CPU Adam on the host (the rest keep fp32 master weights, Adam's moments
    # and fp32 gradients on the GPU), and whether the 16-bit parameters live on the host
    optimizer_host_share: float = 1.0
    params_on_host: bool = True
    sub_group: int = SUB_GROUP
    # zero_optimization.overlap_comm of a ZeRO-1/2 config (two reduce buckets alive at once); None: the layout's preset
    overlap_comm: bool | None = None
    max_live: int = MAX_LIVE  # zero_optimization.stage3_max_live_parameters
    # the config names DeepSpeed's optimizer, which steps one parameter group; without one the Trainer's (or a loop's)
    # torch AdamW steps two (weight decay on and off), and ZeRO-1/2 keep the reduced-gradient buffer of the second
    # alive while the first steps on its fp32 copy
    config_optimizer: bool = False

    @property
    def zero3_placement(self) -> dict:
        """zero3_offload_host's keyword arguments: where this run puts ZeRO-3's optimizer and parameters."""
        return dict(optimizer_host_share=self.optimizer_host_share, params_on_host=self.params_on_host,
                    sub_group=self.sub_group)

    def __post_init__(self):
        unknown = sorted(set(self.long_context) - set(LONG_CONTEXT_PARTS))
        if unknown:
            raise ValueError(f"unknown long-context part(s) {', '.join(unknown)} (the parts are: "
                             f"{', '.join(LONG_CONTEXT_PARTS)})")

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def checkpointing(self) -> bool:
        """Layers are checkpointed: asked for, or implied by offloading their saved inputs."""
        return self.gradient_checkpointing or "offload_activations" in self.long_context

    def tokens(self, sequence_parallel: bool = True) -> int:
        """Tokens of activations on each GPU: the micro batch's, split over the Ulysses group when it applies."""
        sp = self.sequence_parallel if sequence_parallel else 1
        return -(-self.seq // sp) * self.micro_batch

    @property
    def element_bytes(self) -> int:
        """Bytes of one weight, gradient or activation element in the run's training dtype."""
        return 2 if self.dtype in ("bf16", "fp16") else 4


@dataclass
class Estimate:
    setup: str
    phases: dict = field(default_factory=dict)  # phase -> {component -> bytes per GPU}
    host_per_node: int = 0
    nvme_per_node: int = 0

    @property
    def phase(self) -> str:
        """The phase of the step that peaks."""
        return max(self.phases, key=lambda name: sum(self.phases[name].values()))

    @property
    def gpu(self) -> dict:
        """Component -> bytes per GPU at the peak."""
        return self.phases[self.phase]

    @property
    def gpu_total(self) -> int:
        return int(sum(self.gpu.values()))

    def as_dict(self) -> dict:
        return {**asdict(self), "phase": self.phase, "gpu": self.gpu, "gpu_total": self.gpu_total}


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


def pinned_blocks_exact() -> bool:
    from .long_context.offload import pinned_blocks_exact as exact

    return exact()


def offloaded_activation_bytes(model: ModelShape, run: RunShape, residual: int, sequence_parallel: bool = True) -> int:
    """Host bytes per GPU process that offload_activations holds: each checkpointed layer's saved input
    (seq x hidden, in the residual stream's dtype; the rotary cos/sin are keyword arguments of the checkpointed
    call, not saved: 12.00 GiB pinned at 128k tokens and 24.00 at 256k on one H200, 24 layers x 2048 x 2 bytes).
    A torch whose pinned cache rounds blocks up to a power of two (2.11: 96.0 GiB at 614,400 tokens, 4 GiB per
    2.34 GiB layer input) holds the rounded size."""
    if "offload_activations" not in run.long_context:
        return 0
    block = run.tokens(sequence_parallel) * model.hidden * residual
    return model.layers * torch_pinned(block, exact=pinned_blocks_exact())


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


def torch_pinned(nbytes: int, exact: bool | None = None) -> int:
    """Host bytes torch's pinned-memory cache holds for a block: the next power of two, unless the cache gives
    blocks their exact size (``exact``; by default only when PYTORCH_CUDA_ALLOC_CONF sets
    pinned_max_round_threshold_mb, as nothing else does for DeepSpeed's tensor.pin_memory() buffers)."""
    if exact is None:
        from .long_context.offload import pinned_threshold_configured

        exact = pinned_threshold_configured()
    if exact or nbytes <= 0:
        return max(0, nbytes)
    return 1 << (nbytes - 1).bit_length()


def zero2_offload_host(trained: int, ranks: int, half: int, accumulation: int = 1, param_sizes=(),
                       fp32_accumulation: bool = True) -> int:
    """Host bytes per rank of DeepSpeed 0.19.8's ZeRO-2 CPU offload (pin_memory on, as the preset sets it):
    pinned, each block rounded by torch's cache: the fp32 master partition, a 16-bit copy of it for the upload, the
    fp32 gradient partition and, when accumulating without data_types.grad_accum_dtype fp32, one 16-bit buffer per
    parameter (stage_1_and_2.py); pageable: CPU Adam's two fp32 moments. One H200, 1.35B, accumulation 16:
    23.38 GiB pinned and 35.42 GiB RSS measured with 16-bit accumulation, 20.13 and 32.09 with fp32 accumulation
    (the process itself is PROCESS_HOST_BYTES, which estimate adds)."""
    partition = trained // ranks
    pinned = torch_pinned(4 * partition) + torch_pinned(half * partition) + torch_pinned(4 * partition)
    if accumulation > 1 and not fp32_accumulation:
        buffers = sum(torch_pinned(half * n) for n in param_sizes) if param_sizes else half * trained
        pinned += buffers // ranks
    return pinned + 8 * partition


def sub_groups(partition: int, size: int = SUB_GROUP, param_sizes=(), ranks: int = 1) -> list:
    """Elements of each of ZeRO-3's optimizer sub-groups in one rank's partition (zero_optimization.sub_group_size).

    Given the weights' sizes in the model's order (ModelShape.param_sizes), as stage3.py's _create_fp16_sub_groups
    forms them for one parameter group (a preset's optimizer gets all parameters in one): each rank's share of one
    parameter after another, a sub-group closed once it reaches ``size`` (so an embedding larger than ``size`` is a
    sub-group of its own), and what the sizes leave out (the norms) with the last one. A tied LM head is left out
    when the sizes would exceed the partition. Without sizes, equal sub-groups of ``size``."""
    shares = [-(-n // ranks) for n in param_sizes]
    if sum(shares) > partition:
        shares = shares[:-1]  # the LM head shares the embedding's weights
    if not shares or sum(shares) > partition:
        return [size] * (partition // size) + ([partition % size] if partition % size else [])
    groups, current = [], 0
    for share in shares:
        current += share
        if current >= size:
            groups.append(current)
            current = 0
    # the norms sit between the weights, in the same parameter group when DeepSpeed builds the optimizer from the
    # config (every preset names one): counted with the last sub-group
    rest = current + partition - sum(shares)
    if groups and not current:
        groups[-1] += rest
    elif rest:
        groups.append(rest)
    return groups


def sub_groups_on_gpu(groups: list, optimizer_host_share: float) -> int:
    """How many sub-groups stay on the GPU under offload_optimizer.ratio: the first int((1 - ratio) * count),
    as stage3.py's subgroup_to_device assigns them."""
    return int((1 - optimizer_host_share) * len(groups))


def zero3_offload_host(psi: int, trained: int, ranks: int, half: int, optimizer_host_share: float = 1.0,
                       params_on_host: bool = True, sub_group: int = SUB_GROUP, param_sizes=(),
                       pinned_update_copy: bool = True) -> int:
    """Host bytes per rank of DeepSpeed 0.19.8's ZeRO-3 CPU offload of parameters and optimizer (pin_memory on):
    pinned, rounded by torch's cache: the flat gradient-partition buffer, the flat 16-bit parameter partitions and
    one fp32 gradient buffer per optimizer sub-group (stage3.py); pageable: the fp32 master partitions and CPU
    Adam's two moments. One H200, 1.35B: 17.25 GiB pinned and 34.34 GiB RSS measured (the process itself is
    PROCESS_HOST_BYTES, which estimate adds). With offload_optimizer.ratio below 1 only the sub-groups stepped on
    the host keep their states and gradient buffers there; without offload_param the 16-bit partitions are on the
    GPU, and ZeroCallback copies the host sub-groups' updates to them through a pinned 16-bit buffer each
    (engine_fixes.zero3_updates_copied_through_pinned_memory; ``pinned_update_copy=False`` leaves those buffers out,
    as DeepSpeed alone allocates). ``param_sizes`` (the weights in the model's order) forms the sub-groups as
    DeepSpeed does."""
    partition, weights = trained // ranks, psi // ranks
    groups = sub_groups(partition, sub_group, param_sizes, ranks)
    on_host = groups[sub_groups_on_gpu(groups, optimizer_host_share):]
    states = 12 * sum(on_host) + sum(torch_pinned(4 * g) for g in on_host)
    if params_on_host:
        # the flat gradient buffer counted at fp32 size: with the parameters offloaded the step's other host
        # transients add about as much again (34.34 GiB measured against 35.04 planned so)
        return torch_pinned(4 * partition) + torch_pinned(half * weights) + states
    # without offload_param, the flat gradient buffer in its 16-bit accumulation dtype, and at start-up its pageable
    # original beside the pinned copy; then the pinned update buffers (1.35B at ratio 0 / 0.1 / 0.2 / 0.3 with them:
    # 8.47 / 11.27 / 13.15 / 13.92 GiB measured with the process, 8.5 / 10.1 / 11.9 / 13.8 planned)
    flat = torch_pinned(half * partition)
    staging = sum(torch_pinned(half * g) for g in on_host) if pinned_update_copy else 0
    return max(flat + states, flat + half * partition) + staging


# One training process's own resident memory on a GPU node, whatever it trains: Python with torch, transformers
# and DeepSpeed loaded (0.92 GiB at launch on one H200, the benchmark harness --host-peaks) and the CUDA context (the plain
# Trainer's whole peak RSS there is 1.9 GiB with its 8.33B model on the GPU)
PROCESS_HOST_BYTES = 2 * GIB

# recipes/zero3_nvme.json's swap settings (tests/planner/test_largest.py holds them to the recipe)
NVME_PARAM_BUFFERS = 5  # offload_param.buffer_count
NVME_PARAM_BUFFER_SIZE = 100_000_000  # offload_param.buffer_size (elements)
NVME_MAX_IN_CPU = 1_000_000_000  # offload_param.max_in_cpu (16-bit parameters kept in host memory)
NVME_OPTIMIZER_BUFFERS = 4  # offload_optimizer.buffer_count


def zero3_nvme_host(trained: int, ranks: int, half: int) -> int:
    """Host bytes per rank of DeepSpeed 0.19.8's ZeRO-Infinity (zero3_nvme: parameters and optimizer on NVMe,
    pin_memory on), every buffer allocated at init and alive through training:
    - the flat gradient-partition buffer in the gradient-accumulation dtype (the model's 16 bits unless the config
      sets data_types.grad_accum_dtype), torch-pinned (DeepSpeedZeroOptimizer_Stage3._setup_for_real_optimizer);
    - up to max_in_cpu 16-bit parameters kept in host memory, torch-pinned
      (_create_param_groups_fp16_flat_cpu_memory);
    - the parameter swapper's buffer_count x buffer_size 16-bit buffers, page-locked by the aio handle at their
      exact size (AsyncPartitionedParameterSwapper._configure_aio);
    - when the partition is over max_in_cpu, one 16-bit buffer of the largest sub-group for writing updated
      parameters back (reserve_partitioned_swap_space, from _create_fp16_partitions_with_defragmentation);
    - the optimizer swapper's buffer_count fp32 buffers of the largest sub-group, page-locked (OptimizerSwapper's
      SwapBufferManager), through which the master weights, Adam's moments and the gradients are swapped;
    - a pageable fp32 buffer of the largest sub-group that every swapped sub-group's .grad views
      (initialize_optimizer_states).
    The master weights, Adam's moments and the fp32 gradients themselves are on NVMe (``offloaded_states``)."""
    partition = trained // ranks
    sub_group = min(partition, SUB_GROUP)
    pinned = torch_pinned(half * partition) + torch_pinned(half * min(partition, NVME_MAX_IN_CPU))
    locked = NVME_PARAM_BUFFERS * NVME_PARAM_BUFFER_SIZE * half + NVME_OPTIMIZER_BUFFERS * 4 * sub_group
    if partition > NVME_MAX_IN_CPU:
        locked += half * sub_group
    return pinned + locked + 4 * sub_group


def offloaded_states(setup: str, psi: int, trained: int, ranks: int, gpus_per_node: int, half: int,
                     accumulation: int = 1, param_sizes=(), fp32_accumulation: bool = True,
                     placement: dict | None = None) -> tuple:
    """(host, NVMe) bytes per node of an offload preset's model states: ZeRO-2 keeps the fp32 gradient partition,
    master weights and Adam states on the host (zero2_offload_host); ZeRO-3 adds the 16-bit parameters, and
    zero3_nvme keeps all of it on NVMe (zero3_nvme_host's swap buffers stay on the host): the 16-bit parameter
    partitions (AsyncPartitionedParameterSwapper writes each one's swap file at partition time, and it stays
    there even for the ones later kept in host memory), and the fp32 master weights, Adam's two moments and
    the fp32 gradients (PartitionedOptimizerSwapper: one file each per sub-group). ``placement`` is zero3_offload's
    when it differs from the preset's (RunShape.zero3_placement, zero3_placement_of)."""
    if setup == "zero2_offload":
        return zero2_offload_host(trained, ranks, half, accumulation, param_sizes, fp32_accumulation) * gpus_per_node, 0
    if setup == "zero3_offload":
        return zero3_offload_host(psi, trained, ranks, half, **(placement or {}), param_sizes=param_sizes) \
            * gpus_per_node, 0
    if setup == "zero3_nvme":
        states = (half * psi + 16 * trained) // ranks * gpus_per_node
        return zero3_nvme_host(trained, ranks, half) * gpus_per_node, states
    return 0, 0


def setup_of_config(config: dict) -> str | None:
    """The planner's name for a DeepSpeed config's layout (zero1 ... zero3_nvme); None without ZeRO."""
    from .config.dotted import get_dotted, offload_devices, zero_stage

    stage = zero_stage(config)
    if not stage:
        return None
    if stage == 3:
        param_device = get_dotted(config, "zero_optimization.offload_param.device")
        if param_device == "nvme":
            return "zero3_nvme"
        return "zero3_offload" if offload_devices(config) else "zero3"
    if stage == 2 and offload_devices(config):
        return "zero2_offload"
    return f"zero{stage}"


def run_of_config(run: RunShape, config: dict) -> RunShape:
    """``run`` with what a DeepSpeed config's keys set (DeepSpeed's defaults where it leaves them out, the planner's
    preset values where a value is "auto"): the reduce bucket, overlap_comm, stage3_max_live_parameters, ZeRO-3's
    placement (offload_optimizer.ratio, offload_param, sub_group_size) and the accumulation dtype of an offloaded
    optimizer. Planned this way, the shipped presets give the figures the planner gives their names."""
    from .config.dotted import accumulates_in_fp32, get_dotted, number_at

    zero = lambda key, default: int(number_at(config, f"zero_optimization.{key}", default))
    overlap = get_dotted(config, "zero_optimization.overlap_comm")
    return replace(run, **zero3_placement_of(config), bucket=zero("reduce_bucket_size", 500_000_000),
                   max_live=zero("stage3_max_live_parameters", MAX_LIVE),
                   # DeepSpeed 0.19.8 turns overlap_comm on by default for stage 3 only, where the planner does not
                   # count it; unset on ZeRO-1/2 it is off
                   overlap_comm=bool(overlap) if isinstance(overlap, bool) else False,
                   fp32_accumulation=accumulates_in_fp32(config), config_optimizer="optimizer" in config)


def nvme_buffer_problem(config: dict, largest_param: int, ranks: int) -> str | None:
    """Why DeepSpeed's NVMe parameter swapper would refuse this model, or None: every rank's partition of a parameter
    is swapped through one of offload_param.buffer_count buffers of buffer_size elements, and
    AsyncPartitionedParameterSwapper.get_buffer (DeepSpeed 0.19.8) asserts "More elements ... than buffer size" at
    zero.Init for a partition above it (a large vocabulary's embedding, a fused expert weight)."""
    block = (config.get("zero_optimization") or {}).get("offload_param")
    if not isinstance(block, dict) or block.get("device") != "nvme":
        return None
    buffer_size = int(float(block.get("buffer_size", NVME_PARAM_BUFFER_SIZE)))
    partition = -(-largest_param // max(1, ranks))  # DeepSpeed pads each parameter to a multiple of the ranks
    if partition <= buffer_size:
        return None
    return (f"zero_optimization.offload_param.buffer_size is {buffer_size:,} elements, and this model's largest "
            f"parameter ({largest_param:,} elements) is {partition:,} per rank over {ranks} rank(s): DeepSpeed's NVMe "
            "parameter swapper refuses a partition larger than its buffer when zero.Init partitions the model. "
            f"Fix: set zero_optimization.offload_param.buffer_size to at least {partition:,} (each of its "
            "buffer_count buffers is pinned host memory), or run on more ranks.")


def zero3_placement_of(config: dict) -> dict:
    """RunShape's ZeRO-3 placement fields as a DeepSpeed config sets them (offload_optimizer.ratio, offload_param,
    sub_group_size)."""
    from .config.dotted import optimizer_host_share, params_on_host, sub_group_size

    return dict(optimizer_host_share=optimizer_host_share(config), params_on_host=params_on_host(config),
                sub_group=sub_group_size(config, SUB_GROUP))


def host_memory_problem(config: dict, params: int, trained: int, ranks: int, local_ranks: int, half: int,
                        host_bytes: int) -> str | None:
    """Why an offload preset's model states and its processes cannot fit this node's memory (the planner's figure),
    or None. The figure is DeepSpeed's host buffers without gradient accumulation's extra ones, plus each process's
    own memory (PROCESS_HOST_BYTES); it is under every peak measured on one H200 (73.2 GiB against 73.4 for the
    largest zero2_offload model), so only a run that cannot fit is refused."""
    setup = setup_of_config(config)
    # DeepSpeed's own buffers only: ZeroCallback's pinned update buffers are left out, and allocated only when the
    # host has room for them (engine_fixes)
    placement = {**zero3_placement_of(config), "pinned_update_copy": False}
    states = offloaded_states(setup, params, trained, ranks, local_ranks, half, placement=placement)[0] if setup else 0
    if not states:
        return None
    host = states + PROCESS_HOST_BYTES * local_ranks
    if host <= host_bytes:
        return None
    # zero3_nvme's host bytes are its swap buffers: moving the states to NVMe is no longer a way out
    if setup == "zero3_nvme":
        held, fixes = "DeepSpeed's pinned NVMe swap buffers", "more nodes"
    else:
        held = "fp32 master weights, Adam states, gradients and DeepSpeed's pinned buffers"
        fixes = "zero3_nvme (the states on NVMe), more nodes"
    return (f"{setup} keeps {states / GIB:.1f} GiB of model states in host memory on this node, "
            f"{host / GIB:.1f} GiB with its {local_ranks} process(es) (hf-zero plan's figure: {held} of "
            f"{params / 1e9:.2f}B parameters over {ranks} rank(s), {local_ranks} on this node, and "
            f"{PROCESS_HOST_BYTES / GIB:g} GiB per process), and the node has {host_bytes / GIB:.1f} GiB. "
            f"Fix: {fixes}, or a smaller model (hf-zero plan MODEL --gpus N --cpu-mem GIB).")


def estimate(setup: str, model: ModelShape, run: RunShape) -> Estimate:
    psi, n = model.params, run.ranks
    # what trains: every weight, or a LoRA adapter on the frozen base (its gradients and optimizer states alone)
    trained = model.adapter_params(run.lora_r, run.lora_targets) if run.lora_r else psi
    if run.lora_r:
        psi += trained  # the adapter's own weights
    half = run.element_bytes
    activations = activation_bytes(model, run, zero3=setup.startswith("zero3")) if setup != "ddp" else 0
    bucket = run.bucket * half  # DeepSpeed allocates the configured size, however small the model
    # at the step the 16-bit gradient partition and its fp32 copy are alive together (one tensor in fp32 runs)
    fp32_grad = 4 if half == 4 else half + 4
    host = nvme = 0
    # the weights' sizes in the model's order, for the offload presets' buffers and sub-groups (not for an adapter)
    sizes = model.param_sizes() if trained == psi else ()
    if setup == "ddp":
        phases = _plain_phases(model, run, psi, trained)
    elif setup in REDUCE_BUCKETS:
        buckets = REDUCE_BUCKETS[setup] if run.overlap_comm is None else 1 + bool(run.overlap_comm)
        weights = {"parameters": half * psi}
        if setup != "zero2_offload":
            weights["optimizer"] = 12 * trained // n
        phases = {"backward": {**weights, "activations": activations},
                  # the loss and logits are freed by the time the first gradients are reduced
                  "first gradient reduce": {**weights, "activations": activations - logit_bytes(model, run),
                                            "buffers": buckets * bucket}}
        if setup == "zero2_offload":
            host, _ = offloaded_states(setup, psi, trained, n, run.gpus_per_node, half, run.accumulation, sizes,
                                       run.fp32_accumulation)
            if run.fp32_accumulation:
                # the fp32 gradient partition on the GPU, built at a step's first reduce and freed by its optimizer
                # step: accumulating, it is alive through the later micro-batches' backward too
                phases["first gradient reduce"]["gradients"] = 4 * trained // n
                if run.accumulation > 1:
                    phases["backward"]["gradients"] = 4 * trained // n
        else:
            # the gradient buffer and its fp32 copy: one tensor only in fp32 runs of a config's one-group optimizer
            # (2 ranks, fp32 on CPU, torch AdamW: 1,496,052 bytes live at the step against 1,282,928 with the config's)
            step_grad = fp32_grad if run.config_optimizer else half + 4
            phases["optimizer step"] = {**weights, "gradients": step_grad * trained // n}
    else:  # ZeRO-3: parameters sharded, gathered for use
        offload = setup != "zero3"
        # what stays gathered from the forward into the backward: fetched parameters are not released
        # while stage3_max_live_parameters allows (measured 1.91 GiB at 1e9 for 1.35B at N = 2, 4 and 8;
        # none on one GPU, where nothing is gathered unless the parameters live on the host)
        fetched = n > 1 or (offload and run.params_on_host)
        gathered = half * (min(run.max_live, psi) + model.largest_layer) if fetched else 0
        if not offload:
            states = {"parameters": half * psi // n, "gradients": half * trained // n, "optimizer": 12 * trained // n}
            phases = {"backward": {**states, "activations": activations, "buffers": bucket + gathered},
                      "optimizer step": {**states, "step": fp32_grad * min(SUB_GROUP, trained // n), "buffers": bucket}}
        else:
            phases = {"backward": {"activations": activations, "buffers": bucket + gathered}}
            placement = None
            if setup == "zero3_offload":
                placement = run.zero3_placement
                if not run.params_on_host:
                    phases["backward"]["parameters"] = half * psi // n
                groups = sub_groups(trained // n, run.sub_group, sizes, n)
                # the GPU's sub-groups: fp32 master weights, Adam's two moments and an fp32 gradient buffer each
                on_gpu = sum(groups[:sub_groups_on_gpu(groups, run.optimizer_host_share)])
                if on_gpu:
                    phases["backward"]["optimizer"] = 16 * on_gpu
            host, nvme = offloaded_states(setup, psi, trained, n, run.gpus_per_node, half, param_sizes=sizes,
                                          placement=placement)
    if setup != "ddp":
        host += offloaded_activation_bytes(model, run, half) * run.gpus_per_node
    else:
        host += offloaded_activation_bytes(model, run, 4, sequence_parallel=False) * run.gpus_per_node
    host += _add_reference_model(setup, phases, model, run)
    host += PROCESS_HOST_BYTES * run.gpus_per_node
    return Estimate(setup, phases, host, nvme)


def _plain_phases(model: ModelShape, run: RunShape, psi: int, trained: int) -> dict:
    """The plain Trainer's phases: fp32 weights and Adam states (torch's fused AdamW: no step temporaries);
    gradients only from the backward on (the Trainer sets them to None after each step), so the backward's
    start holds none. With bf16/fp16, autocast's 16-bit copies of the Linear weights are cached for the whole
    forward: every one of them until the forward ends, and, without checkpointing, saved into the backward.
    DDP's reducer copies every fp32 gradient into its buckets (gradient_as_bucket_view is off), allocated with
    the reducer; one process is not wrapped in DDP (29.73 GiB measured on one H200, 34.72 on two)."""
    states = {"parameters": 4 * psi, "optimizer": 8 * trained}
    buckets = 4 * trained if run.ranks > 1 else 0
    copies = 2 * model.linear_params if run.dtype in ("bf16", "fp16") else 0
    activations = plain_activation_phases(model, run)
    # accumulating, the fp32 gradients of the earlier micro-batches are alive through every later forward
    # (34.74 GiB at 16 micro-batches of 4 x 1024 tokens on one H200, 29.73 at one)
    accumulated = 4 * trained if run.accumulation > 1 else 0
    phases = {}
    for moment, held in activations.items():
        cached = copies if moment == "loss" or not run.checkpointing else 0
        phases[moment] = {**states, "activations": held, "buffers": buckets + cached}
        if accumulated:
            phases[moment]["gradients"] = accumulated
    if "recompute" in phases and not accumulated:  # the LM head's fp32 gradient is there by the first recompute (full fine-tuning)
        phases["recompute"]["gradients"] = 4 * model.vocab * model.hidden if trained == psi else 0
    phases["optimizer step"] = {**states, "gradients": 4 * trained, "buffers": buckets}
    return phases


def _add_reference_model(setup: str, phases: dict, model: ModelShape, run: RunShape) -> int:
    """TRL's reference model (DPO, KTO) in each phase; returns what it adds to the host per node.

    TRL builds it as a second DeepSpeed engine from the run's config: under ZeRO-3 partitioned like the policy
    (1/N of its 16-bit weights per GPU, on the host with parameter offload), under ZeRO-1/2 with stage 0, so a
    whole 16-bit copy sits on every GPU (as under DDP). With LoRA, TRL turns the adapter off instead: no copy."""
    if not run.reference_model or run.lora_r:
        return 0
    weights = run.element_bytes * model.params
    if setup in ("zero3_offload", "zero3_nvme"):
        return weights // run.ranks * run.gpus_per_node
    per_gpu = weights // run.ranks if setup == "zero3" else weights
    for components in phases.values():
        components["reference model"] = per_gpu
    return 0


@dataclass
class Plan:
    model: ModelShape
    run: RunShape
    gpu_capacity: int
    cpu_capacity: int | None
    estimates: list
    choice: str | None
    reasons: dict  # setup -> why it was rejected (or chosen)
    max_seq: dict = field(default_factory=dict)  # setup -> the longest sequence that fits (None: not even 1 token)
    nvme_capacity: int | None = None
    largest: dict = field(default_factory=dict)  # setup -> LargestModel, when asked for
    # an offload choice's faster alternative: zero3_offload with this share of the optimizer on the host and the
    # parameters on the GPU (partial_offload_share), or None
    partial_offload: float | None = None


# Measured on one H200 (benchmarks/1xH200/offload, 1.35B, 65,536 tokens per optimizer step): ZeRO-3 with 30% of its
# optimizer on the host and the parameters on the GPU ran 38,801 tokens/s (93% of the plain Trainer) with ZeroCallback's
# pinned update copy, zero2_offload 38,374 (its step in the next forward), zero3_offload 31,361; with 50% on the host
# it ran 29,818 without the pinned copy (30% ran 34,413 so), no faster than the preset. The plan offers the split up to
# 30%.
PARTIAL_OFFLOAD_MOST_ON_HOST = 0.3
PARTIAL_OFFLOAD_SUB_GROUP = 100_000_000  # fine enough to split a model of a few billion parameters in tenths


def partial_offload_share(model: ModelShape, run: RunShape, gpu_capacity: int, host_capacity: int | None,
                          headroom: float = 0.9) -> float | None:
    """The smallest share of ZeRO-3's optimizer on the host, in tenths up to PARTIAL_OFFLOAD_MOST_ON_HOST, with
    which zero3_offload fits keeping the parameters and the rest of the optimizer on the GPU; None if none fits."""
    for tenths in range(round(PARTIAL_OFFLOAD_MOST_ON_HOST * 10) + 1):
        trial = replace(run, optimizer_host_share=tenths / 10, params_on_host=False, sub_group=PARTIAL_OFFLOAD_SUB_GROUP)
        if not shortfall(estimate("zero3_offload", model, trial), gpu_capacity, host_capacity, headroom):
            return tenths / 10
    return None


MAX_SEQ_SEARCHED = 1 << 31  # the longest sequence the search tries; reported as it is when even that fits


RESOURCES = ("GPU", "host", "NVMe")
MAX_LAYERS_SEARCHED = 1024  # the most decoder layers largest_model tries


def overflowed(est: Estimate, gpu_capacity: int, host_capacity: int | None, headroom: float = 0.9,
               nvme_capacity: int | None = None) -> tuple:
    """The resources (of RESOURCES) whose ``headroom`` the estimate is over; a capacity of None is no limit."""
    used = {"GPU": (est.gpu_total, gpu_capacity), "host": (est.host_per_node, host_capacity),
            "NVMe": (est.nvme_per_node, nvme_capacity)}
    return tuple(name for name, (need, capacity) in used.items() if capacity is not None and need > headroom * capacity)


def shortfall(est: Estimate, gpu_capacity: int, host_capacity: int | None, headroom: float = 0.9,
              nvme_capacity: int | None = None) -> str | None:
    """Why an estimate does not fit ``headroom`` of each GPU, of host memory and of the NVMe disk for DeepSpeed's
    swap files; None when it fits."""
    over = overflowed(est, gpu_capacity, host_capacity, headroom, nvme_capacity)
    if "GPU" in over:
        return f"needs {est.gpu_total / GIB:.1f} GiB per GPU, over {headroom:.0%} of {gpu_capacity / GIB:g} GiB"
    if "host" in over:
        return (f"needs {est.host_per_node / GIB:.1f} GiB of host memory per node, over {headroom:.0%} of "
                f"{host_capacity / GIB:g} GiB")
    if "NVMe" in over:
        return (f"needs {est.nvme_per_node / GIB:.1f} GiB of NVMe per node for DeepSpeed's swap files, over "
                f"{headroom:.0%} of {nvme_capacity / GIB:g} GiB")
    return None


def _deepest_fitting(fits, bound: int) -> tuple:
    """(last, first_over) for a ``fits`` that holds from 1 up to some k and not beyond (memory grows with the
    searched size in every term): the largest k <= ``bound`` that fits, found by doubling then bisection, and the
    smallest size that does not (None when ``bound`` itself fits); (0, 1) when not even 1 fits."""
    if not fits(1):
        return 0, 1
    low, high = 1, 2
    while high <= bound and fits(high):
        low, high = high, 2 * high
    if high > bound:  # every doubling up to the bound fits: the bound itself, or the bisection below it
        if fits(bound):
            return bound, None
        high = bound
    while high - low > 1:  # fits(low), not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, high


def longest_sequence(setup: str, model: ModelShape, run: RunShape, gpu_capacity: int, host_capacity: int | None,
                     headroom: float = 0.9, nvme_capacity: int | None = None) -> int | None:
    """The longest sequence (the run's micro batch, a multiple of the sequence-parallel size) whose estimate fits,
    found by bisection over the same estimate; None when not even the shortest fits."""
    step = run.sequence_parallel

    def fits(k: int) -> bool:
        planned = estimate(setup, model, replace(run, seq=k * step))
        return shortfall(planned, gpu_capacity, host_capacity, headroom, nvme_capacity) is None

    longest, _ = _deepest_fitting(fits, MAX_SEQ_SEARCHED // step)
    return longest * step or None


@dataclass
class LargestModel:
    setup: str
    model: ModelShape | None  # None: not even one decoder layer fits
    estimate: Estimate | None
    limit: tuple  # the resources one more layer (or the first layer) would overflow; () when the search's bound fits

    def as_dict(self) -> dict:
        est = self.estimate
        return {"layers": self.model.layers if self.model else None, "params": self.model.params if self.model else None,
                "gpu_total": est.gpu_total if est else None, "host_per_node": est.host_per_node if est else None,
                "nvme_per_node": est.nvme_per_node if est else None, "limit": list(self.limit)}


def largest_model(setup: str, model: ModelShape, run: RunShape, gpu_capacity: int, host_capacity: int | None,
                  nvme_capacity: int | None = None, headroom: float = 0.9,
                  max_layers: int = MAX_LAYERS_SEARCHED) -> LargestModel:
    """The deepest model of ``model``'s shape family (its hidden size, heads, intermediate size and vocabulary)
    whose estimate fits, found by bisection over the decoder layers as ``longest_sequence`` does over the sequence.
    ``limit`` names the
    resources the next layer would overflow: where the host or the NVMe disk, not the GPU, stops the model."""

    def over(layers: int) -> tuple:
        planned = estimate(setup, model.with_layers(layers), run)
        return overflowed(planned, gpu_capacity, host_capacity, headroom, nvme_capacity)

    layers, first_over = _deepest_fitting(lambda k: not over(k), max_layers)
    if not layers:
        return LargestModel(setup, None, None, over(1))
    deepest = model.with_layers(layers)
    return LargestModel(setup, deepest, estimate(setup, deepest, run), over(first_over) if first_over else ())


def planned_setups(run: RunShape, configs: dict | None = None) -> list:
    """(name, layout, run) for each setup to plan: DDP and the planner's layouts by name, or, with ``configs`` (name ->
    DeepSpeed config dict; None for a built-in name), each config planned from its keys (its layout from its stage and
    offload devices, its buckets and placement through run_of_config)."""
    if configs is None:
        return [(name, name, run) for name in SETUPS]
    planned = []
    for name, config in configs.items():
        if config is None:
            planned.append((name, name, run))
            continue
        layout = setup_of_config(config)
        if layout is None:
            raise ValueError(f"{name}: no ZeRO stage (zero_optimization.stage is 0 or missing); the planner plans "
                             "ZeRO configs, and DDP without one")
        planned.append((name, layout, run_of_config(run, config)))
    return planned


def make_plan(model: ModelShape, run: RunShape, gpu_mem_gib: float, cpu_mem_gib: float | None = None,
              headroom: float = 0.9, nvme_mem_gib: float | None = None, largest: bool = False,
              configs: dict | None = None) -> Plan:
    """The fastest setup that fits in ``headroom`` of each GPU (and of host memory and NVMe for offload), and the
    longest sequence each setup fits; with ``largest``, also the deepest model of the model's shape each setup
    fits. The plain Trainer has no Ulysses: with sequence parallelism it is not a choice. ``configs``: plan these
    named DeepSpeed configs from their keys instead of the built-in setups (planned_setups)."""
    capacity, host_capacity = int(gpu_mem_gib * GIB), int(cpu_mem_gib * GIB) if cpu_mem_gib else None
    nvme_capacity = int(nvme_mem_gib * GIB) if nvme_mem_gib else None
    setups = planned_setups(run, configs)
    layouts = {name: layout for name, layout, _ in setups}
    estimates = [replace(estimate(layout, model, shape), setup=name) for name, layout, shape in setups]
    reasons, choice = {}, None
    # least sharding first; configs of one layout in the order given
    for est in sorted(estimates, key=lambda e: PREFERENCE.index(layouts[e.setup])):
        short = shortfall(est, capacity, host_capacity, headroom, nvme_capacity)
        if layouts[est.setup] == "ddp" and run.sequence_parallel > 1:
            reasons[est.setup] = ("not with sequence parallelism: Ulysses runs under DeepSpeed (Accelerate's "
                                  "sp_backend='deepspeed'); planned here with the whole sequence on each GPU")
        elif short:
            reasons[est.setup] = short
        elif choice is None:
            choice = est.setup
            reasons[est.setup] = f"fits: {est.gpu_total / GIB:.1f} GiB per GPU; the least sharding that fits is the fastest"
        else:
            reasons[est.setup] = f"fits, but shards or offloads more than {choice} (slower)"
    longest = {name: longest_sequence(layout, model, shape, capacity, host_capacity, headroom, nvme_capacity)
               for name, layout, shape in setups}
    deepest = {name: replace(largest_model(layout, model, shape, capacity, host_capacity, nvme_capacity, headroom),
                             setup=name)
               for name, layout, shape in setups} if largest else {}
    # offload chosen for the whole optimizer, while the GPU could hold most of it (a placement the run already
    # asks for is planned as given)
    partial = None
    chosen = next((shape for name, _, shape in setups if name == choice), run)
    if choice is not None and layouts[choice] in ("zero2_offload", "zero3_offload", "zero3_nvme") \
            and chosen.optimizer_host_share == 1 and chosen.params_on_host:
        partial = partial_offload_share(model, chosen, capacity, host_capacity, headroom)
    return Plan(model, run, capacity, host_capacity, estimates, choice, reasons, longest, nvme_capacity, deepest,
                partial)
