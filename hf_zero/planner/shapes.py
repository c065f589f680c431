"""What the planner plans: a model's shape, a run's shape, and a per-GPU memory estimate of one setup."""

from dataclasses import asdict, dataclass, field, replace

from ..zero3.moe import active_params
from .deepspeed_defaults import NvmeSwap

GIB = 1024**3


# hf_zero's long-context switch, each part optional:
# - tiled_mlp: DeepSpeed's TiledMLP runs each decoder layer's MLP on ceil(seq / hidden) sequence shards and
#   recomputes it in backward, so the MLP's seq x intermediate tensors exist for one shard at a time;
# - fused_loss: TRL's fused LM head (add_fused_lm_head) scores the labelled positions in tiles: the seq x vocab
#   logits, their fp32 upcast and their gradient never exist;
# - offload_activations: each checkpointed layer's saved input goes to pinned host memory in the forward and
#   comes back in the backward (it implies gradient checkpointing).
LONG_CONTEXT_PARTS = ("tiled_mlp", "fused_loss", "offload_activations")


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
    lora_r: int = 0  # > 0: a peft LoRA adapter of this rank trains on the frozen model
    lora_targets: tuple = ("all-linear",)  # the decoder layers' Linear names it adapts (peft's target_modules)
    fp32_adapters: bool = False  # ZeRO-3 trains the adapter in fp32 (without ZeroCallback's cast to 16 bits)
    reference_model: bool = False  # a frozen reference copy of the model (TRL's DPO/KTO), none with LoRA
    sequence_parallel: int = 1  # DeepSpeed's Ulysses sp_size: each GPU holds seq / sp tokens of activations
    long_context: tuple = ()  # parts of hf_zero's long-context switch (LONG_CONTEXT_PARTS)
    accumulation: int = 1  # gradient accumulation steps: micro-batches per optimizer step
    # What a DeepSpeed config's keys set (run_of_config reads them). None: as the layout's preset in recipes/ sets
    # it, when a setup is estimated by its layout's name (the harness and the tests do).
    bucket: int | None = None  # zero_optimization.reduce_bucket_size, elements
    # zero_optimization.overlap_comm of a ZeRO-1/2 config: two reduce buckets alive at once
    overlap_comm: bool | None = None
    max_live: int | None = None  # zero_optimization.stage3_max_live_parameters
    # zero2_offload accumulates gradients in an fp32 partition on the GPU (data_types.grad_accum_dtype fp32);
    # False: DeepSpeed's default, 16-bit buffers per parameter on the host
    fp32_accumulation: bool | None = None
    # ZeRO-3's placement (offload_optimizer.ratio, offload_param, sub_group_size): the share of the optimizer's
    # sub-groups stepped by CPU Adam on the host (the rest keep fp32 master weights, Adam's moments and fp32
    # gradients on the GPU), and whether the 16-bit parameters live off the GPU
    optimizer_host_share: float | None = None
    params_on_host: bool | None = None
    sub_group: int | None = None
    # the config names DeepSpeed's optimizer, which steps one parameter group; without one the Trainer's (or a loop's)
    # torch AdamW steps two (weight decay on and off), and ZeRO-1/2 keep the reduced-gradient buffer of the second
    # alive while the first steps on its fp32 copy
    config_optimizer: bool | None = None
    nvme_swap: NvmeSwap | None = None  # zero3_nvme's swap buffers (offload_param / offload_optimizer on NVMe)

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

