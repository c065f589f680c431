"""Host memory and NVMe: DeepSpeed's offload buffers as torch's pinned cache holds them, the optimizer's
sub-groups, and activations offloaded to the host."""

from .deepspeed_defaults import SUB_GROUP_SIZE, NvmeSwap
from .shapes import GIB, ModelShape, RunShape


def pinned_blocks_exact() -> bool:
    from ..long_context.offload import pinned_blocks_exact as exact

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


def torch_pinned(nbytes: int, exact: bool | None = None) -> int:
    """Host bytes torch's pinned-memory cache holds for a block: the next power of two, unless the cache gives
    blocks their exact size (``exact``; by default only when PYTORCH_CUDA_ALLOC_CONF sets
    pinned_max_round_threshold_mb, as nothing else does for DeepSpeed's tensor.pin_memory() buffers)."""
    if exact is None:
        from ..long_context.offload import pinned_threshold_configured

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


def sub_groups(partition: int, size: int = SUB_GROUP_SIZE, param_sizes=(), ranks: int = 1) -> list:
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
                       params_on_host: bool = True, sub_group: int = SUB_GROUP_SIZE, param_sizes=(),
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

def zero3_nvme_host(trained: int, ranks: int, half: int, swap: NvmeSwap = NvmeSwap(),
                    sub_group: int = SUB_GROUP_SIZE) -> int:
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
    ``swap`` holds the buffer settings and ``sub_group`` the config's sub_group_size. The master weights, Adam's
    moments and the fp32 gradients themselves are on NVMe (``zero3_nvme_files``)."""
    partition = trained // ranks
    sub_group = min(partition, sub_group)
    pinned = torch_pinned(half * partition) + torch_pinned(half * min(partition, swap.max_in_cpu))
    locked = swap.param_buffers * swap.param_buffer_size * half + swap.optimizer_buffers * 4 * sub_group
    if partition > swap.max_in_cpu:
        locked += half * sub_group
    return pinned + locked + 4 * sub_group


def zero3_nvme_files(psi: int, trained: int, ranks: int, half: int) -> int:
    """NVMe bytes per rank of ZeRO-Infinity's swap files: the 16-bit parameter partitions
    (AsyncPartitionedParameterSwapper writes each one's swap file at partition time, and it stays there even for the
    ones later kept in host memory), and the fp32 master weights, Adam's two moments and the fp32 gradients
    (PartitionedOptimizerSwapper: one file each per sub-group)."""
    return (half * psi + 16 * trained) // ranks

