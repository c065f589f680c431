"""ZeRO-aware per-GPU memory model: which setup fits a model on given GPUs, and why the others do not.

Bytes per parameter Psi (bf16/fp16 mixed precision, Adam), N = data-parallel ranks over all nodes,
as DeepSpeed allocates them. The ZeRO paper counts 16 bytes (2 + 2 + 12); DeepSpeed also keeps an
fp32 gradient partition for the optimizer, which is why its own estimators count 18:

    setup          on each GPU                                   in host memory / on NVMe
    DDP            16 (fp32 weights, grads, Adam) + 4 (DDP's gradient buckets, when N > 1)
    zero1, zero2   2 (16-bit weights) + 16/N (fp32 master, m, v, grads)
    zero2_offload  2 + 2 reduce buckets, 16-bit (measured)          16/N per rank
    zero3          18/N + an fp32 step buffer of one sub-group   -
    zero3_offload  4 x the reduce bucket, 16-bit (calibrated)     18/N per rank
    zero3_nvme     as zero3_offload                                18/N per rank on NVMe

ZeRO-1 and ZeRO-2 come out the same: DeepSpeed's ZeRO-1 reduces gradients in the same buckets as
ZeRO-2 (both measured 20.2 GiB on the 1.35B model). Activations follow the model's shapes
(hidden h, intermediate i, layers, vocab) per token; with gradient checkpointing only each layer's
input is kept, plus one layer being recomputed; torch.compile's fused layers keep fewer of them.
The constants marked "calibrated" were fitted to peaks measured on 2x H200 (FIELD_NOTES,
hf_zero/bench/results); tests/test_planner.py holds every one to +-15%. The
model-state bytes per stage are also checked on CPU, where they are countable: tests/
test_zero_training.py counts every live tensor just before DeepSpeed's optimizer step.
"""

from dataclasses import asdict, dataclass, field

GIB = 1024**3
SETUPS = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme")
# Least sharding first, offload only when nothing on the GPUs fits: the first that fits is the fastest.
# Measured on 2x H200, 1.35B (hf_zero/bench/results/2xH200): zero3 30k tokens/s, zero3_offload 7.5k
# (its Adam step runs on the CPU, as zero2_offload's does).
PREFERENCE = ("ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_nvme")

ACTIVATION_SCALE = 0.90  # calibrated: bytes saved per token per layer, as a share of 22h + 8i (16-bit)
LOGIT_BYTES = 3  # calibrated: bytes per token per vocabulary entry alive at the peak (16-bit logits + loss)
COMPILED_ACTIVATIONS = 0.68  # calibrated: torch.compile (regional) fuses norms and SwiGLU, saving fewer tensors
AUTOCAST_ACTIVATIONS = 1.25  # calibrated: DDP keeps fp32 weights, so autocast leaves an fp32 residual stream
BUCKET_BYTES_PER_ELEMENT = 1  # calibrated: auto -> 5e8-element buckets added 0.5 GiB to ZeRO-2's peak
SUB_GROUP = 1_000_000_000  # the presets' sub_group_size: ZeRO-3 steps the optimizer one sub-group at a time
OFFLOAD_STAGING_BUCKETS = 4  # calibrated: ZeRO-3 offload peaks, 1.35B on 1 and 2 H200s (the same 13.06 GiB)


@dataclass
class ModelShape:
    params: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    largest_layer: int  # parameters of the biggest decoder layer (what ZeRO-3 gathers at once)
    name: str = ""

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
        layers = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        largest = max((sum(p.numel() for p in block.parameters()) for ml in layers for block in ml), default=params)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", 0)
        return cls(params=params, hidden=hidden, intermediate=getattr(text, "intermediate_size", None) or 4 * hidden,
                   layers=getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", 0),
                   vocab=getattr(text, "vocab_size", 0), largest_layer=largest, name=name)


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

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass
class Estimate:
    setup: str
    gpu: dict = field(default_factory=dict)  # component -> bytes per GPU
    host_per_node: int = 0
    nvme_per_node: int = 0

    @property
    def gpu_total(self) -> int:
        return int(sum(self.gpu.values()))

    def as_dict(self) -> dict:
        return {**asdict(self), "gpu_total": self.gpu_total}


def activation_bytes(model: ModelShape, run: RunShape) -> int:
    tokens = run.seq * run.micro_batch
    width = 2 if run.dtype in ("bf16", "fp16") else 4
    per_layer_token = ACTIVATION_SCALE * (22 * model.hidden + 8 * model.intermediate) * width / 2
    if run.compiled:
        per_layer_token *= COMPILED_ACTIVATIONS
    if run.gradient_checkpointing:
        # each layer's input is kept; one layer at a time is recomputed with its full activations
        kept = tokens * model.layers * model.hidden * width + tokens * per_layer_token
    else:
        kept = tokens * model.layers * per_layer_token
    return int(kept + tokens * model.vocab * LOGIT_BYTES * width / 2)


def estimate(setup: str, model: ModelShape, run: RunShape) -> Estimate:
    psi, n = model.params, run.ranks
    half = 2 if run.dtype in ("bf16", "fp16") else 4
    activations = activation_bytes(model, run)
    buckets = min(run.bucket, psi) * BUCKET_BYTES_PER_ELEMENT
    host = nvme = 0
    if setup == "ddp":
        # DDP's reducer copies every fp32 gradient into its buckets (gradient_as_bucket_view is off);
        # one process is not wrapped in DDP. Measured on 1.35B: 34.7 GiB on 2 H200s, 29.7 GiB on one.
        gpu = {"parameters": 4 * psi, "gradients": 4 * psi, "optimizer": 8 * psi,
               "activations": int(activations * (AUTOCAST_ACTIVATIONS if half == 2 else 1)),
               "buffers": 4 * psi if n > 1 else 0}
    elif setup in ("zero1", "zero2"):
        gpu = {"parameters": half * psi, "gradients": 4 * psi // n, "optimizer": 12 * psi // n,
               "activations": activations, "buffers": buckets}
    elif setup == "zero2_offload":
        # What a memory snapshot found alive at the peak (1.35B on one H200, results/1xH200/sweeps/
        # offload_memory_snapshot.json): the 16-bit weights, the activations and DeepSpeed's two reduce
        # buckets (setup_buckets, 16-bit, 0.93 GiB each at 5e8); the gradients go to the host bucket by bucket.
        # Independent of N: 13.34 and 13.36 GiB on 1 and 2 H200s, 6.50 GiB with checkpointing.
        gpu = {"parameters": half * psi, "activations": activations, "buffers": 2 * min(run.bucket, psi) * half}
        host = 16 * psi // n * run.gpus_per_node
    else:  # ZeRO-3: parameters sharded; the largest layer is gathered at a time
        # DeepSpeed allocates the whole reduce bucket as one flat gradient buffer at init (2 GB for a
        # 100k-parameter model in fp32 with 5e8 buckets, counted on CPU), whatever the model's size
        gathered = 2 * model.largest_layer * half + run.bucket * half
        if setup == "zero3":
            gpu = {"parameters": half * psi // n, "gradients": 4 * psi // n, "optimizer": 12 * psi // n,
                   "step": 4 * min(SUB_GROUP, psi // n), "activations": activations, "buffers": gathered}
        else:
            # offload_optimizer keeps the fp32 gradient partitions on the host, so what stays on the GPU is
            # the reduce bucket's staging, whatever N: 13.06 GiB on 1 and on 2 H200s for 1.35B (calibrated;
            # the per-rank partition term this replaced predicted +25% on one GPU)
            gpu = {"gradients": OFFLOAD_STAGING_BUCKETS * min(run.bucket, psi) * half, "activations": activations,
                   "buffers": gathered}
            states = (half + 16) * psi // n * run.gpus_per_node
            if setup == "zero3_offload":
                host = states
            else:
                nvme = states
                host = 4 * min(run.bucket, psi) * half * run.gpus_per_node  # pinned swap buffers
    return Estimate(setup, gpu, host, nvme)


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
