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
memory snapshot of the peak showed them (``hf-zero bench --memory-snapshot`` and ``--simulate-ranks``):

    setup          backward phase, on each GPU                        in host memory / on NVMe
    DDP            16 (fp32 weights, grads, Adam) + 4 (DDP's gradient buckets, when N > 1)
    zero1, zero2   2 (16-bit weights) + 12/N (fp32 master, Adam m, v)
    zero2_offload  2 + the reduce buckets                               16/N per rank
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
torch.compile's fused layers keep fewer of them. The constants marked "calibrated" were fitted to
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

from dataclasses import asdict, dataclass, field

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
        linears = {} if biggest is None else {
            name.rsplit(".", 1)[-1]: (m.in_features, m.out_features)
            for name, m in biggest.named_modules() if isinstance(m, torch.nn.Linear)}
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", 0)
        return cls(params=params, hidden=hidden, intermediate=getattr(text, "intermediate_size", None) or 4 * hidden,
                   layers=getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", 0),
                   vocab=getattr(text, "vocab_size", 0), largest_layer=largest, name=name, linears=linears,
                   model_type=getattr(config, "model_type", ""))

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

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

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
    width = run.element_bytes
    return int(run.seq * run.micro_batch * model.vocab * LOGIT_BYTES * width / 2)


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
    """Everything the forward keeps for the backward, the logits and the loss's gradient included."""
    tokens = run.seq * run.micro_batch
    width = run.element_bytes
    per_layer_token = ACTIVATION_SCALE * (22 * model.hidden + 8 * model.intermediate) * width / 2
    if run.lora_r:
        per_layer_token -= frozen_base_saving(model, run, zero3)
    if run.compiled:
        per_layer_token *= COMPILED_ACTIVATIONS
    if run.gradient_checkpointing:
        # each layer's input is kept; one layer at a time is recomputed with its full activations
        kept = tokens * model.layers * model.hidden * width + tokens * per_layer_token
    else:
        kept = tokens * model.layers * per_layer_token
    return int(kept) + logit_bytes(model, run)


def estimate(setup: str, model: ModelShape, run: RunShape) -> Estimate:
    psi, n = model.params, run.ranks
    # what trains: every weight, or a LoRA adapter on the frozen base (its gradients and optimizer states alone)
    trained = model.adapter_params(run.lora_r, run.lora_targets) if run.lora_r else psi
    if run.lora_r:
        psi += trained  # the adapter's own weights
    half = run.element_bytes
    activations = activation_bytes(model, run, zero3=setup.startswith("zero3"))
    bucket = run.bucket * half  # DeepSpeed allocates the configured size, however small the model
    # at the step the 16-bit gradient partition and its fp32 copy are alive together (one tensor in fp32 runs)
    fp32_grad = 4 if half == 4 else half + 4
    host = nvme = 0
    if setup == "ddp":
        # DDP's reducer copies every fp32 gradient into its buckets (gradient_as_bucket_view is off);
        # one process is not wrapped in DDP. Measured on 1.35B: 34.72 GiB on 2 H200s, 29.73 GiB on one.
        # Unlike the ZeRO terms these are a count, not a snapshot (DDP cannot run on a fake process
        # group): the totals fit within 2%, 7.5% with checkpointing.
        phases = {"backward": {"parameters": 4 * psi, "gradients": 4 * trained, "optimizer": 8 * trained,
                               "activations": activations, "buffers": 4 * trained if n > 1 else 0}}
    elif setup in REDUCE_BUCKETS:
        weights = {"parameters": half * psi}
        if setup != "zero2_offload":
            weights["optimizer"] = 12 * trained // n
        phases = {"backward": {**weights, "activations": activations},
                  # the loss and logits are freed by the time the first gradients are reduced
                  "first gradient reduce": {**weights, "activations": activations - logit_bytes(model, run),
                                            "buffers": REDUCE_BUCKETS[setup] * bucket}}
        if setup == "zero2_offload":
            host = 16 * trained // n * run.gpus_per_node  # the gradients go to the host bucket by bucket
        else:
            phases["optimizer step"] = {**weights, "gradients": fp32_grad * trained // n}
    else:  # ZeRO-3: parameters sharded, gathered for use
        offload = setup != "zero3"
        # what stays gathered from the forward into the backward: fetched parameters are not released
        # while stage3_max_live_parameters allows (measured 1.91 GiB at 1e9 for 1.35B at N = 2, 4 and 8;
        # none on one GPU, where nothing is gathered unless the parameters live on the host)
        gathered = half * (min(MAX_LIVE, psi) + model.largest_layer) if n > 1 or offload else 0
        if not offload:
            states = {"parameters": half * psi // n, "gradients": half * trained // n, "optimizer": 12 * trained // n}
            phases = {"backward": {**states, "activations": activations, "buffers": bucket + gathered},
                      "optimizer step": {**states, "step": fp32_grad * min(SUB_GROUP, trained // n), "buffers": bucket}}
        else:
            # the fp32 gradient partitions and optimizer states live on the host (or NVMe)
            phases = {"backward": {"activations": activations, "buffers": bucket + gathered}}
            states = (half * psi + 16 * trained) // n * run.gpus_per_node
            if setup == "zero3_offload":
                host = states
            else:
                nvme = states
                host = 4 * min(run.bucket, psi) * half * run.gpus_per_node  # pinned swap buffers
    host += _add_reference_model(setup, phases, model, run)
    return Estimate(setup, phases, host, nvme)


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


def make_plan(model: ModelShape, run: RunShape, gpu_mem_gib: float, cpu_mem_gib: float | None = None,
              headroom: float = 0.9) -> Plan:
    """The fastest setup that fits in ``headroom`` of each GPU (and of host memory for offload)."""
    capacity, host_capacity = int(gpu_mem_gib * GIB), int(cpu_mem_gib * GIB) if cpu_mem_gib else None
    estimates = [estimate(s, model, run) for s in SETUPS]
    reasons, choice = {}, None
    for est in sorted(estimates, key=lambda e: PREFERENCE.index(e.setup)):
        if est.gpu_total > headroom * capacity:
            reasons[est.setup] = f"needs {est.gpu_total / GIB:.1f} GiB per GPU, over {headroom:.0%} of {gpu_mem_gib:g} GiB"
        elif host_capacity is not None and est.host_per_node > headroom * host_capacity:
            reasons[est.setup] = f"needs {est.host_per_node / GIB:.1f} GiB of host memory per node, over {headroom:.0%} of {cpu_mem_gib:g} GiB"
        elif choice is None:
            choice = est.setup
            reasons[est.setup] = f"fits: {est.gpu_total / GIB:.1f} GiB per GPU; the least sharding that fits is the fastest"
        else:
            reasons[est.setup] = f"fits, but shards or offloads more than {choice} (slower)"
    return Plan(model, run, capacity, host_capacity, estimates, choice, reasons)
