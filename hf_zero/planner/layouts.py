"""The setups the planner plans (DDP and the ZeRO layouts), a DeepSpeed config's layout, and one setup's estimate."""

from dataclasses import replace

from .activations import activation_bytes, logit_bytes, plain_activation_phases
from .host_memory import PROCESS_HOST_BYTES, offloaded_activation_bytes, offloaded_states, sub_groups, sub_groups_on_gpu
from .shapes import MAX_LIVE, SUB_GROUP, Estimate, ModelShape, RunShape

SETUPS = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme")
# Least sharding first, offload only when nothing on the GPUs fits: the first that fits is the fastest.
# Measured on 2x H200, 1.35B (benchmarks/2xH200): zero3 30k tokens/s, zero3_offload 7.5k
# (its Adam step runs on the CPU, as zero2_offload's does).
PREFERENCE = ("ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_nvme")

# Reduce buckets alive at once: two with overlap_comm (DeepSpeed's setup_buckets double-buffers), one without
REDUCE_BUCKETS = {"zero1": 2, "zero2": 1, "zero2_offload": 2}


def setup_of_config(config: dict) -> str | None:
    """The planner's name for a DeepSpeed config's layout (zero1 ... zero3_nvme); None without ZeRO."""
    from ..config.dotted import get_dotted, offload_devices, zero_stage

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
    from ..config.dotted import accumulates_in_fp32, get_dotted, number_at

    zero = lambda key, default: int(number_at(config, f"zero_optimization.{key}", default))
    overlap = get_dotted(config, "zero_optimization.overlap_comm")
    return replace(run, **zero3_placement_of(config), bucket=zero("reduce_bucket_size", 500_000_000),
                   max_live=zero("stage3_max_live_parameters", MAX_LIVE),
                   # DeepSpeed 0.19.8 turns overlap_comm on by default for stage 3 only, where the planner does not
                   # count it; unset on ZeRO-1/2 it is off
                   overlap_comm=bool(overlap) if isinstance(overlap, bool) else False,
                   fp32_accumulation=accumulates_in_fp32(config), config_optimizer="optimizer" in config)


def zero3_placement_of(config: dict) -> dict:
    """RunShape's ZeRO-3 placement fields as a DeepSpeed config sets them (offload_optimizer.ratio, offload_param,
    sub_group_size)."""
    from ..config.dotted import optimizer_host_share, params_on_host, sub_group_size

    return dict(optimizer_host_share=optimizer_host_share(config), params_on_host=params_on_host(config),
                sub_group=sub_group_size(config, SUB_GROUP))


def estimate(setup: str, model: ModelShape, run: RunShape) -> Estimate:
    psi = model.params
    # what trains: every weight, or a LoRA adapter on the frozen base (its gradients and optimizer states alone)
    trained = model.adapter_params(run.lora_r, run.lora_targets) if run.lora_r else psi
    if run.lora_r:
        psi += trained  # the adapter's own weights
    half = run.element_bytes
    activations = activation_bytes(model, run, zero3=setup.startswith("zero3")) if setup != "ddp" else 0
    host = nvme = 0
    # the weights' sizes in the model's order, for the offload presets' buffers and sub-groups (not for an adapter)
    sizes = model.param_sizes() if trained == psi else ()
    if setup == "ddp":
        phases = _plain_phases(model, run, psi, trained)
    elif setup in REDUCE_BUCKETS:
        phases, host = _zero12_phases(setup, model, run, psi, trained, activations, sizes)
    else:  # ZeRO-3: parameters sharded, gathered for use
        phases, host, nvme = _zero3_phases(setup, model, run, psi, trained, activations, sizes)
    if setup != "ddp":
        host += offloaded_activation_bytes(model, run, half) * run.gpus_per_node
    else:
        host += offloaded_activation_bytes(model, run, 4, sequence_parallel=False) * run.gpus_per_node
    host += _add_reference_model(setup, phases, model, run)
    host += PROCESS_HOST_BYTES * run.gpus_per_node
    return Estimate(setup, phases, host, nvme)


def _zero12_phases(setup: str, model: ModelShape, run: RunShape, psi: int, trained: int, activations: int,
                   sizes) -> tuple:
    """ZeRO-1/2's phases on each GPU, and zero2_offload's host bytes per node."""
    n, half = run.ranks, run.element_bytes
    bucket = run.bucket * half  # DeepSpeed allocates the configured size, however small the model
    host = 0
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
        fp32_grad = 4 if half == 4 else half + 4
        step_grad = fp32_grad if run.config_optimizer else half + 4
        phases["optimizer step"] = {**weights, "gradients": step_grad * trained // n}
    return phases, host


def _zero3_phases(setup: str, model: ModelShape, run: RunShape, psi: int, trained: int, activations: int,
                  sizes) -> tuple:
    """ZeRO-3's phases on each GPU, and its offload layouts' host and NVMe bytes per node."""
    n, half = run.ranks, run.element_bytes
    bucket = run.bucket * half  # DeepSpeed allocates the configured size, however small the model
    # at the step the 16-bit gradient partition and its fp32 copy are alive together (one tensor in fp32 runs)
    fp32_grad = 4 if half == 4 else half + 4
    host = nvme = 0
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
    return phases, host, nvme


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


