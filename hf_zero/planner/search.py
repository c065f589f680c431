"""The search: which setup fits, the longest sequence and the deepest model each fits, and the plan."""

from dataclasses import dataclass, field, replace

from .estimate import estimate
from .layouts import Layout, layout_named, layout_of_config
from .settings import preset_configs, run_of_config, settled
from .shapes import GIB, Estimate, ModelShape, RunShape


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
    run = settled(run, layout_named(setup).preset)

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
    run = settled(run, layout_named(setup).preset)

    def over(layers: int) -> tuple:
        planned = estimate(setup, model.with_layers(layers), run)
        return overflowed(planned, gpu_capacity, host_capacity, headroom, nvme_capacity)

    layers, first_over = _deepest_fitting(lambda k: not over(k), max_layers)
    if not layers:
        return LargestModel(setup, None, None, over(1))
    deepest = model.with_layers(layers)
    return LargestModel(setup, deepest, estimate(setup, deepest, run), over(first_over) if first_over else ())


def planned_setups(run: RunShape, configs: dict | None = None) -> list:
    """(name, layout, run) for each setup to plan: ``configs`` maps a name to a DeepSpeed config dict (None: the plain
    Trainer, no DeepSpeed), each planned from its keys (its layout from the table, its buffers and placement through
    run_of_config); without ``configs``, DDP and every preset in recipes/ (settings.preset_configs). A layout the
    table does not model is refused (layouts.layout_of_config)."""
    planned = []
    for name, config in (preset_configs() if configs is None else configs).items():
        layout = layout_of_config(config, source=name)
        if layout is None:
            raise ValueError(f"{name}: no ZeRO stage (zero_optimization.stage is 0 or missing); the planner plans "
                             "ZeRO configs, and DDP without one")
        planned.append((name, layout, run if config is None else run_of_config(run, config)))
    return planned


def _offloads_the_whole_optimizer(layout: Layout, run: RunShape) -> bool:
    """An offload layout with all of the optimizer on the host and, under ZeRO-3, the parameters too (a placement the
    run already splits is planned as given)."""
    return layout.offloads_optimizer and run.optimizer_host_share == 1 and (run.params_on_host or layout.stage < 3)


def make_plan(model: ModelShape, run: RunShape, gpu_mem_gib: float, cpu_mem_gib: float | None = None,
              headroom: float = 0.9, nvme_mem_gib: float | None = None, largest: bool = False,
              configs: dict | None = None) -> Plan:
    """The fastest setup that fits in ``headroom`` of each GPU (and of host memory and NVMe for offload), and the
    longest sequence each setup fits; with ``largest``, also the deepest model of the model's shape each setup
    fits. The plain Trainer has no Ulysses: with sequence parallelism it is not a choice. ``configs``: the named
    DeepSpeed configs to plan from their keys, by default DDP and every preset in recipes/ (planned_setups)."""
    capacity, host_capacity = int(gpu_mem_gib * GIB), int(cpu_mem_gib * GIB) if cpu_mem_gib else None
    nvme_capacity = int(nvme_mem_gib * GIB) if nvme_mem_gib else None
    setups = planned_setups(run, configs)
    layouts = {name: layout for name, layout, _ in setups}
    estimates = [replace(estimate(layout, model, shape), setup=name) for name, layout, shape in setups]
    reasons, choice = {}, None
    # least sharding first; configs of one layout in the order given
    for est in sorted(estimates, key=lambda e: layouts[e.setup].speed_rank):
        short = shortfall(est, capacity, host_capacity, headroom, nvme_capacity)
        if layouts[est.setup].stage is None and run.sequence_parallel > 1:
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
    if choice is not None and _offloads_the_whole_optimizer(layouts[choice], chosen):
        partial = partial_offload_share(model, chosen, capacity, host_capacity, headroom)
    return Plan(model, run, capacity, host_capacity, estimates, choice, reasons, longest, nvme_capacity, deepest,
                partial)
