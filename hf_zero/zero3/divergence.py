"""Stop a ZeRO-3 run whose ranks are about to fetch different modules, naming them, instead of hanging.

Under ZeRO-3 each module's parameters are gathered by a collective just before the module runs, so every rank
must run the same modules in the same order. When they do not (an image on some ranks only, a branch taken on one
rank, a generate that ends earlier on one rank), the gathers stop matching: NCCL waits for its timeout or mixes
data, gloo aborts with "collective mismatch". ``FetchOrderWatch`` puts a small check before each gather: the ranks
exchange which module they are about to fetch (three integers over a gloo group, so no GPU synchronization) and,
when they differ, every rank raises the same RanksDivergedError naming each rank's module, the optimizer step and
the micro-step. It also marks the start and the end of each forward, so a rank that runs fewer modules than the
others is caught where it stops. Its cost is one small host-side all_gather per module with parameters, per
forward; ZeroCallback and hf_zero.prepare keep it for the first steps of a run by default.
"""

from ..distributed import host_group, is_distributed, simulated_ranks
from ..errors import RanksDivergedError

# Optimizer steps watched by default: the first steps are where a data or code path that differs between ranks
# shows (a mixed-modality batch, a branch on the rank); later ones cost the exchange for little
FIRST_STEPS = 2
# How long a rank waits at a check for the others: long enough for a rank that is still saving or evaluating
WAIT_S = 300
_FORWARD_START, _FORWARD_END = -1, -2
DIVERGENCE_CHECKS = ("first_steps", "always", "off")


def divergence_check_problem(value) -> str | None:
    """Why ``value`` cannot be the divergence_check option (None when it can)."""
    if value in DIVERGENCE_CHECKS:
        return None
    return (f"divergence_check must be one of {', '.join(map(repr, DIVERGENCE_CHECKS))}, got {value!r}. Fix: "
            f"divergence_check='first_steps' (the first {FIRST_STEPS} optimizer steps), 'always', or 'off'.")


def fetching_modules(model) -> list:
    """(index, module) for every module below the root whose forward can make ZeRO-3 gather parameters: every module
    with parameters in it or below it, and ZeRO-3 leaf modules (gathered whole; modules inside a leaf are not hooked
    by DeepSpeed). Containers count too: a forward that reads a child's weight directly (Qwen2-VL's patch embedding
    reads its convolution's dtype) makes DeepSpeed gather it before the child's own hook, and the container's check
    comes first."""
    from deepspeed.utils import z3_leaf_module

    found, inside_leaf = [], set()
    for index, (_, module) in enumerate(model.named_modules()):
        if index == 0 or id(module) in inside_leaf:
            continue  # the root: the start-of-forward check stands for it
        if z3_leaf_module(module):
            inside_leaf.update(id(m) for m in module.modules())
            found.append((index, module))
        elif any(True for _ in module.parameters()):
            found.append((index, module))
    return found


class FetchOrderWatch:
    """Checks, before each ZeRO-3 gather of ``engine``'s module, that every rank is about to gather the same one.

    ``steps``: the optimizer steps to watch (None: the whole run); the hooks are removed after them."""

    def __init__(self, engine, group, world: int, steps: int | None = FIRST_STEPS):
        self.engine, self.group, self.world, self.steps = engine, group, world, steps
        model = engine.module
        self.names = [name or "the model" for name, _ in model.named_modules()]
        self.handles = [module.register_forward_pre_hook(self._hook(index), prepend=True)
                        for index, module in fetching_modules(model)]
        # the root's start and end: a rank that runs fewer modules meets the others at one of these
        self.handles.append(model.register_forward_pre_hook(self._hook(_FORWARD_START), prepend=True))
        self.handles.append(model.register_forward_hook(self._end_hook))
        self.checks = 0

    def _hook(self, index: int):
        def before_fetch(module, args):
            self.check(index)
        return before_fetch

    def _end_hook(self, module, args, output):
        self.check(_FORWARD_END)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _where(self) -> tuple[int, int]:
        accumulation = max(1, int(getattr(self.engine, "gradient_accumulation_steps", lambda: 1)()))
        return int(getattr(self.engine, "global_steps", 0)), int(getattr(self.engine, "micro_steps", 0)) % accumulation

    def check(self, index: int) -> None:
        step, micro = self._where()
        if self.steps is not None and step >= self.steps:
            self.remove()
            return
        import torch
        import torch.distributed as dist

        mine = torch.tensor([index, step, micro], dtype=torch.int64)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        try:
            dist.all_gather(gathered, mine, group=self.group)
        except RuntimeError as e:
            raise RanksDivergedError(
                f"ZeRO-3 ranks diverged: at step {step}, micro-step {micro} this rank was about to fetch "
                f"{self._name(index)} and the other ranks did not reach a fetch within {WAIT_S} s "
                f"({str(e).strip().splitlines()[0]}); they run something else (fewer forwards, a generate that "
                f"ended earlier, a crash). {self._fix()}") from None
        self.checks += 1
        rows = [tuple(t.tolist()) for t in gathered]
        if len(set(rows)) > 1:
            raise RanksDivergedError(self._message(rows))

    def _name(self, index: int) -> str:
        if index == _FORWARD_START:
            return "the start of a forward"
        if index == _FORWARD_END:
            return "nothing more (its forward had ended)"
        return f"{self.names[index]!r}"

    def _message(self, rows) -> str:
        step, micro = rows[0][1], rows[0][2]
        each = "; ".join(f"rank {rank}: {self._name(index)}" + (f" (step {s}, micro-step {m})" if (s, m) != (step, micro)
                                                                  else "")
                         for rank, (index, s, m) in enumerate(rows))
        return (f"ZeRO-3 ranks diverged at step {step}, micro-step {micro}: each module's parameters are gathered by "
                f"a collective, so every rank must run the same modules in the same order, but they were about to "
                f"fetch different ones ({each}). {self._fix()}")

    @staticmethod
    def _fix() -> str:
        return ("Fix: make every rank take the same path through the model in each step (the same branch; for "
                "vision-language models, batches whose modalities match across ranks), or make the module that differs "
                "a ZeRO-3 leaf (deepspeed.utils.set_z3_leaf_modules), which gathers it whole on every rank. "
                "See hf_zero's docs, callback.md (divergence_check).")


def zero3_on_several_ranks(engine) -> bool:
    """Whether ``engine`` runs ZeRO-3 across two or more real ranks: where ranks can fetch different modules."""
    import torch.distributed as dist

    if not is_distributed() or dist.get_world_size() < 2 or simulated_ranks():
        return False
    return getattr(engine, "zero_optimization_stage", lambda: 0)() == 3


def compiled_whole(engine) -> bool:
    """Whether the engine's forward is compiled whole (DeepCompile, engine.compile()): ZeRO-3's own hooks are off
    there, and a host collective in a module hook would break the graph. DeepSpeed spells one flag as a method and
    the other as a property."""
    flags = (getattr(engine, name, False) for name in ("is_deepcompile_enabled", "is_compiled"))
    return any(flag() if callable(flag) else flag for flag in flags)


def watch_fetch_order(engine, mode: str = "first_steps") -> FetchOrderWatch | None:
    """Start a FetchOrderWatch on a built ZeRO-3 engine with more than one data-parallel rank; None where there is
    nothing to compare (one rank, another stage, ``mode`` "off") or where the engine's forward is compiled whole
    (DeepCompile, engine.compile()): ZeRO-3's own hooks are off there, and a host collective in a module hook would
    break the graph."""
    if mode == "off" or not zero3_on_several_ranks(engine):
        return None
    if compiled_whole(engine):
        return None
    import torch.distributed as dist

    # gloo on the host, even beside NCCL: the check reads no GPU tensor and adds no GPU synchronization
    return FetchOrderWatch(engine, host_group(WAIT_S), dist.get_world_size(), None if mode == "always" else FIRST_STEPS)
