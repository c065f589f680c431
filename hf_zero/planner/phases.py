"""Each layout's count: its GPU memory at each phase of a step, and the model states it keeps off the GPUs.

The layouts' table (layouts.py) names one function of each kind per layout; both take the same ``Terms``."""

from dataclasses import dataclass

from .activations import logit_bytes, plain_activation_phases
from .host_memory import (sub_groups, sub_groups_on_gpu, zero2_offload_host, zero3_nvme_files, zero3_nvme_host,
                          zero3_offload_host)
from .shapes import ModelShape, RunShape


@dataclass(frozen=True)
class Terms:
    """What a layout's count starts from."""

    run: RunShape  # every setting a config gives is set (settings.settled)
    psi: int  # weights held: the model's, and an adapter's
    trained: int  # weights that train: all of them, or the adapter's
    ranks: int  # data-parallel ranks over all nodes
    gpus_per_node: int
    half: int  # bytes of a weight, gradient or activation element in the run's dtype
    model: ModelShape | None = None  # None: the model states alone are counted (problems.host_memory_problem)
    sizes: tuple = ()  # the weights' sizes in the model's order, for offload buffers and sub-groups; () for an adapter
    activations: int = 0  # what the forward keeps for the backward under DeepSpeed (activations.activation_bytes)
    pinned_update_copy: bool = True  # ZeroCallback's pinned buffers for a partly offloaded optimizer's updates

    @property
    def bucket(self) -> int:
        """The reduce bucket in bytes: DeepSpeed allocates the configured size, however small the model."""
        return self.run.bucket * self.half

    @property
    def fp32_grad(self) -> int:
        """Bytes per element at the step: the 16-bit gradient and its fp32 copy alive together (one tensor in fp32)."""
        return 4 if self.half == 4 else self.half + 4


def plain_phases(t: Terms) -> dict:
    """The plain Trainer's phases: fp32 weights and Adam states (torch's fused AdamW: no step temporaries);
    gradients only from the backward on (the Trainer sets them to None after each step), so the backward's
    start holds none. With bf16/fp16, autocast's 16-bit copies of the Linear weights are cached for the whole
    forward: every one of them until the forward ends, and, without checkpointing, saved into the backward.
    DDP's reducer copies every fp32 gradient into its buckets (gradient_as_bucket_view is off), allocated with
    the reducer; one process is not wrapped in DDP (29.73 GiB measured on one H200, 34.72 on two)."""
    model, run, trained = t.model, t.run, t.trained
    states = {"parameters": 4 * t.psi, "optimizer": 8 * trained}
    buckets = 4 * trained if t.ranks > 1 else 0
    copies = 2 * model.linear_params if run.dtype in ("bf16", "fp16") else 0
    # accumulating, the fp32 gradients of the earlier micro-batches are alive through every later forward
    # (34.74 GiB at 16 micro-batches of 4 x 1024 tokens on one H200, 29.73 at one)
    accumulated = 4 * trained if run.accumulation > 1 else 0
    phases = {}
    for moment, held in plain_activation_phases(model, run).items():
        cached = copies if moment == "loss" or not run.checkpointing else 0
        phases[moment] = {**states, "activations": held, "buffers": buckets + cached}
        if accumulated:
            phases[moment]["gradients"] = accumulated
    if "recompute" in phases and not accumulated:  # the LM head's fp32 gradient is there by the first recompute (full fine-tuning)
        phases["recompute"]["gradients"] = 4 * model.vocab * model.hidden if trained == t.psi else 0
    phases["optimizer step"] = {**states, "gradients": 4 * trained, "buffers": buckets}
    return phases


def _zero12_backward(t: Terms, weights: dict) -> dict:
    """ZeRO-1/2 from the backward's start (no gradients yet) to the first gradient reduce, when the loss and logits
    are freed and the reduce buckets allocated: two alive at once with overlap_comm (DeepSpeed's setup_buckets
    double-buffers), one without."""
    buckets = 1 + bool(t.run.overlap_comm)
    return {"backward": {**weights, "activations": t.activations},
            "first gradient reduce": {**weights, "activations": t.activations - logit_bytes(t.model, t.run),
                                      "buffers": buckets * t.bucket}}


def zero12_phases(t: Terms) -> dict:
    """ZeRO-1 and ZeRO-2: 16-bit weights on each GPU, fp32 master weights and Adam's moments sharded."""
    weights = {"parameters": t.half * t.psi, "optimizer": 12 * t.trained // t.ranks}
    phases = _zero12_backward(t, weights)
    # the gradient buffer and its fp32 copy: one tensor only in fp32 runs of a config's one-group optimizer
    # (2 ranks, fp32 on CPU, torch AdamW: 1,496,052 bytes live at the step against 1,282,928 with the config's)
    step_grad = t.fp32_grad if t.run.config_optimizer else t.half + 4
    phases["optimizer step"] = {**weights, "gradients": step_grad * t.trained // t.ranks}
    return phases


def zero2_offload_phases(t: Terms) -> dict:
    """ZeRO-2 with the optimizer on the host: 16-bit weights on each GPU, with fp32 accumulation the fp32 gradient
    partition too, built at a step's first reduce and freed by its optimizer step (accumulating, it is alive through
    the later micro-batches' backward)."""
    phases = _zero12_backward(t, {"parameters": t.half * t.psi})
    if t.run.fp32_accumulation:
        phases["first gradient reduce"]["gradients"] = 4 * t.trained // t.ranks
        if t.run.accumulation > 1:
            phases["backward"]["gradients"] = 4 * t.trained // t.ranks
    return phases


def _gathered(t: Terms, fetched: bool) -> int:
    """ZeRO-3's parameters that stay gathered from the forward into the backward: fetched ones are not released while
    stage3_max_live_parameters allows (measured 1.91 GiB at 1e9 for 1.35B at N = 2, 4 and 8)."""
    return t.half * (min(t.run.max_live, t.psi) + t.model.largest_layer) if fetched else 0


def zero3_phases(t: Terms) -> dict:
    """ZeRO-3: 16-bit weights, gradients and the fp32 states sharded; at the step one sub-group of gradients in fp32.
    On one GPU nothing is gathered."""
    n = t.ranks
    states = {"parameters": t.half * t.psi // n, "gradients": t.half * t.trained // n, "optimizer": 12 * t.trained // n}
    step = t.fp32_grad * min(t.run.sub_group, t.trained // n)
    return {"backward": {**states, "activations": t.activations, "buffers": t.bucket + _gathered(t, n > 1)},
            "optimizer step": {**states, "step": step, "buffers": t.bucket}}


def zero3_offload_phases(t: Terms) -> dict:
    """ZeRO-3 with the optimizer on the host: the GPU holds the activations, the reduce bucket and the gathered
    parameters (gathered even on one GPU when they live on the host); without offload_param the 16-bit partitions,
    and with offload_optimizer.ratio below 1 the GPU's sub-groups (fp32 master weights, Adam's two moments and an fp32
    gradient buffer each)."""
    run, n = t.run, t.ranks
    backward = {"activations": t.activations, "buffers": t.bucket + _gathered(t, n > 1 or run.params_on_host)}
    if not run.params_on_host:
        backward["parameters"] = t.half * t.psi // n
    groups = sub_groups(t.trained // n, run.sub_group, t.sizes, n)
    on_gpu = sum(groups[:sub_groups_on_gpu(groups, run.optimizer_host_share)])
    if on_gpu:
        backward["optimizer"] = 16 * on_gpu
    return {"backward": backward}


def zero3_nvme_phases(t: Terms) -> dict:
    """ZeRO-Infinity: the GPU holds the activations, the reduce bucket and the gathered parameters."""
    fetched = t.ranks > 1 or t.run.params_on_host
    return {"backward": {"activations": t.activations, "buffers": t.bucket + _gathered(t, fetched)}}


def nothing_off_gpu(t: Terms) -> tuple:
    return 0, 0


def zero2_offload_states(t: Terms) -> tuple:
    """(host, NVMe) bytes per node: the fp32 gradient partition, master weights and Adam's moments on the host."""
    run = t.run
    host = zero2_offload_host(t.trained, t.ranks, t.half, run.accumulation, t.sizes, run.fp32_accumulation)
    return host * t.gpus_per_node, 0


def zero3_offload_states(t: Terms) -> tuple:
    """(host, NVMe) bytes per node: the optimizer's host sub-groups, and the 16-bit parameters with offload_param."""
    host = zero3_offload_host(t.psi, t.trained, t.ranks, t.half, **t.run.zero3_placement, param_sizes=t.sizes,
                              pinned_update_copy=t.pinned_update_copy)
    return host * t.gpus_per_node, 0


def zero3_nvme_states(t: Terms) -> tuple:
    """(host, NVMe) bytes per node: the swap buffers on the host, the parameters and the optimizer on NVMe."""
    host = zero3_nvme_host(t.trained, t.ranks, t.half, t.run.nvme_swap, t.run.sub_group)
    return host * t.gpus_per_node, zero3_nvme_files(t.psi, t.trained, t.ranks, t.half) * t.gpus_per_node
