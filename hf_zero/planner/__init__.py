"""hf-zero plan's ZeRO-aware per-GPU memory model: which setup fits a model on given GPUs, and why the others do not.

A setup is a layout (DDP, zero1 ... zero3_nvme) from one table keyed by what its DeepSpeed config says: the ZeRO stage
and the offload devices (layouts.LAYOUTS); a combination the table does not model is refused. Within a layout, the
config's keys size the buffers and place the states (settings.run_of_config); the presets in recipes/ are read the
same way, and a setup estimated by its layout's name takes that preset's keys.

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
memory snapshots of the 1.35B model on H200s (benchmarks): tests/planner/test_planner.py holds
every measured peak (1.35B and 7.2B, N = 1 to 8) to +-15%. The optimizer-step bytes are also checked
on CPU, where they are countable: tests/multiproc/test_zero_training.py counts every live tensor just before
DeepSpeed's optimizer step.

LoRA (``RunShape.lora_r``): the base is frozen, so gradients and optimizer states are the adapter's
alone, and a frozen layer saves less for its backward (counted in ``frozen_base_saving``, checked
on CPU by tests/planner/test_planner.py). Left alone, ZeRO-3 trains peft's adapters in fp32 (DeepSpeed
partitions them as they are) and peft keeps an fp32 copy of each adapted layer's input for the
backward: 6.52 GiB with LoRA on every Linear of the 1.35B model (``--simulate-ranks``). ZeroCallback
casts the adapters to the base's 16 bits, as ZeRO-1/2 train them; ``RunShape.fp32_adapters`` plans
a run without that cast.
"""

from .activations import activation_bytes, frozen_base_saving, plain_activation_phases
from .deepspeed_defaults import NvmeSwap
from .estimate import estimate
from .host_memory import (PROCESS_HOST_BYTES, sub_groups, torch_pinned, zero2_offload_host, zero3_nvme_files,
                          zero3_nvme_host, zero3_offload_host)
from .layouts import (LAYOUTS, PREFERENCE, SETUPS, Layout, describe, layout_key, layout_named, layout_of_config,
                      layout_problem, setup_of_config)
from .problems import host_memory_problem, nvme_buffer_problem
from .search import (MAX_LAYERS_SEARCHED, PARTIAL_OFFLOAD_SUB_GROUP, LargestModel, Plan, largest_model,
                     longest_sequence, make_plan, overflowed, partial_offload_share, planned_setups, shortfall)
from .settings import nvme_swap_of, preset_configs, run_of_config, settled, zero3_placement_of
from .shapes import GIB, LONG_CONTEXT_PARTS, Estimate, ModelShape, RunShape

__all__ = [
    "GIB", "LAYOUTS", "LONG_CONTEXT_PARTS", "MAX_LAYERS_SEARCHED", "PARTIAL_OFFLOAD_SUB_GROUP", "PREFERENCE",
    "PROCESS_HOST_BYTES", "SETUPS", "Estimate", "LargestModel", "Layout", "ModelShape", "NvmeSwap", "Plan", "RunShape",
    "activation_bytes", "describe", "estimate", "frozen_base_saving", "host_memory_problem", "largest_model",
    "layout_key", "layout_named", "layout_of_config", "layout_problem", "longest_sequence", "make_plan",
    "nvme_buffer_problem", "nvme_swap_of", "overflowed", "partial_offload_share", "plain_activation_phases",
    "planned_setups", "preset_configs", "run_of_config", "settled", "setup_of_config", "shortfall", "sub_groups",
    "torch_pinned", "zero2_offload_host", "zero3_nvme_files", "zero3_nvme_host", "zero3_offload_host",
    "zero3_placement_of",
]
