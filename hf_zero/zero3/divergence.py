"""Stop a ZeRO-3 run whose ranks are about to fetch different modules, naming them, instead of hanging.

Under ZeRO-3 each module's parameters are gathered by a collective just before the module runs, so every rank
must run the same modules in the same order. When they do not (an image on some ranks only, a branch taken on one
rank, a generate that ends earlier on one rank), the gathers stop matching: NCCL waits for its timeout or mixes
data, gloo aborts with "collective mismatch". ``FetchOrderWatch`` puts a small check before each gather: the ranks
exchange which module they are about to fetch (three integers over a gloo group, so no GPU synchronization) and,
when they differ, every rank raises the same RanksDivergedError naming each rank's module, the optimizer step and
the micro-step. It also marks the start and the end of each forward, so a rank that runs fewer modules than the
others is caught where it stops. While a check waits it asks the other ranks where they are (rank_probe), so a rank
that sits in one of DeepSpeed's collectives instead is found within seconds, not at a timeout. Its cost is one small
host-side all_gather per module with parameters, per forward, for the first steps; after them (the default,
"whole_run") one exchange at each forward's start and end, carrying a hash of the forward's module order.
"""

from ..compat.deepspeed_api import is_leaf
from ..distributed import host_group, is_distributed, simulated_ranks
from ..errors import RanksDivergedError

# Optimizer steps checked module by module: the first steps are where a data or code path that differs between ranks
# shows (a mixed-modality batch, a branch on the rank); after them the default watches each forward's start and end
FIRST_STEPS = 2
# How long a rank waits at a check for the others: long enough for a rank that is still saving or evaluating. A rank
# that cannot come because it sits in another collective is found sooner, by asking it (rank_probe)
WAIT_S = 300
# How long a check waits before asking the other ranks where they are, and again between questions
SLICE_S = 1.0
# A rank that used less than this share of one CPU between two questions does not compute: it waits
IDLE_SHARE = 0.1
# How long a rank must sit at one point of a collective, idle, to count as blocked: longer than a slow all-gather or
# reduce that the waiting rank has already joined (its communication threads carry it while it waits here)
BLOCKED_S = 4.0
_FORWARD_START, _FORWARD_END = -1, -2
DIVERGENCE_CHECKS = ("whole_run", "first_steps", "always", "off")


def divergence_check_problem(value) -> str | None:
    """Why ``value`` cannot be the divergence_check option (None when it can)."""
    if value in DIVERGENCE_CHECKS:
        return None
    return (f"divergence_check must be one of {', '.join(map(repr, DIVERGENCE_CHECKS))}, got {value!r}. Fix: "
            f"divergence_check='whole_run' (every module for the first {FIRST_STEPS} optimizer steps, then each "
            f"forward's module order), 'first_steps' (the first {FIRST_STEPS} steps only), 'always' (every module, "
            f"every step), or 'off'.")


def fetching_modules(model) -> list:
    """(index, module) for every module below the root whose forward can make ZeRO-3 gather parameters: every module
    with parameters in it or below it, and ZeRO-3 leaf modules (gathered whole; modules inside a leaf are not hooked
    by DeepSpeed). Containers count too: a forward that reads a child's weight directly (Qwen2-VL's patch embedding
    reads its convolution's dtype) makes DeepSpeed gather it before the child's own hook, and the container's check
    comes first."""
    found, inside_leaf = [], set()
    for index, (_, module) in enumerate(model.named_modules()):
        if index == 0 or id(module) in inside_leaf:
            continue  # the root: the start-of-forward check stands for it
        if is_leaf(module):
            inside_leaf.update(id(m) for m in module.modules())
            found.append((index, module))
        elif any(True for _ in module.parameters()):
            found.append((index, module))
    return found


class FetchOrderWatch:
    """Checks, before each ZeRO-3 gather of ``engine``'s module, that every rank is about to gather the same one.

    ``steps``: the optimizer steps checked module by module (None: the whole run). After them, ``afterwards``
    "remove" takes the hooks off; "fingerprint" keeps one exchange at each forward's start and one at its end (each
    rank's module order of the forward, hashed); on a mismatch the ranks compare the orders and name the first module
    that differs."""

    def __init__(self, engine, group, world: int, steps: int | None = FIRST_STEPS, afterwards: str = "fingerprint",
                 store=None):
        import torch.distributed as dist

        from ..compat.hf_api import default_store
        from .rank_probe import RankProbe

        self.engine, self.group, self.world, self.steps, self.afterwards = engine, group, world, steps, afterwards
        model = engine.module
        self.names = [name or "the model" for name, _ in model.named_modules()]
        self.handles = [module.register_forward_pre_hook(self._hook(index), prepend=True)
                        for index, module in fetching_modules(model)]
        # the root's start and end: a rank that runs fewer modules meets the others at one of these
        self.handles.append(model.register_forward_pre_hook(self._start_hook, prepend=True))
        self.handles.append(model.register_forward_hook(self._end_hook))
        self.full = True
        self.cause = None  # a sentence on what the checks know makes ranks run different steps (uneven batches)
        self.order = []  # this forward's gathered modules, while only fingerprints are exchanged
        self.checks = self.fingerprints = 0
        self._waiting_at = None
        store = store if store is not None else default_store()
        self.probe = RankProbe(store, dist.get_rank(), world, model, lambda: self._waiting_at)

    def _hook(self, index: int):
        def before_fetch(module, args):
            if self.full:
                self.check(index)
            else:
                self.order.append(index)
        return before_fetch

    def _start_hook(self, module, args):
        step, micro = self._where()
        if self.full and self.steps is not None and step >= self.steps:
            if self.afterwards == "remove":
                self.remove()
                return
            self.full = False
        if self.full:
            self.check(_FORWARD_START)
        else:
            self.order = []
            self._exchange([_FORWARD_START, step, micro, 0, 0])
            self.fingerprints += 1

    def _end_hook(self, module, args, output):
        if self.full:
            self.check(_FORWARD_END)
            return
        step, micro = self._where()
        # a tuple of ints hashes the same in every process (no hash randomization for ints)
        rows = self._exchange([_FORWARD_END, step, micro, hash(tuple(self.order)), len(self.order)])
        self.fingerprints += 1
        if len(set(rows)) > 1:
            self._name_first_difference(step, micro)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.probe.close()

    def _where(self) -> tuple[int, int]:
        accumulation = max(1, int(getattr(self.engine, "gradient_accumulation_steps", lambda: 1)()))
        return int(getattr(self.engine, "global_steps", 0)), int(getattr(self.engine, "micro_steps", 0)) % accumulation

    def check(self, index: int) -> None:
        step, micro = self._where()
        rows = self._exchange([index, step, micro, 0, 0])
        self.checks += 1
        if len(set(rows)) > 1:
            raise RanksDivergedError(self._message([row[:3] for row in rows]))

    def _exchange(self, mine: list) -> list:
        """Every rank's ``mine``, in rank order. While the others do not come, asks them every SLICE_S where they are:
        when every rank either waits here or sits in another collective (which needs this rank, so it never ends),
        all stop at once with each rank's position named."""
        import threading

        import torch
        import torch.distributed as dist

        self.probe.thread_id = threading.get_ident()
        tensor = torch.tensor(mine, dtype=torch.int64)
        gathered = [torch.empty_like(tensor) for _ in range(self.world)]
        work = dist.all_gather(gathered, tensor, group=self.group, async_op=True)
        self._waiting_at = mine[:3]
        try:
            self._wait(work, mine)
        finally:
            self._waiting_at = None
        return [tuple(t.tolist()) for t in gathered]

    def _wait(self, work, mine: list) -> None:
        import time
        from datetime import timedelta

        started, earlier = time.monotonic(), None
        while True:
            try:
                work.wait(timeout=timedelta(seconds=SLICE_S))
                return
            except RuntimeError as e:
                if work.is_completed() or time.monotonic() - started >= WAIT_S:
                    raise RanksDivergedError(
                        f"ZeRO-3 ranks diverged: at step {mine[1]}, micro-step {mine[2]} this rank was about to fetch "
                        f"{self._name(mine[0])} and the other ranks did not reach a fetch within {WAIT_S} s "
                        f"({str(e).strip().splitlines()[0]}); they run something else (fewer forwards, a generate "
                        f"that ended earlier, a crash).{self._cause()} {self._fix()}") from None
            answers = self.probe.ask()
            earlier = _since(answers, earlier)
            if self._deadlocked(answers, earlier):
                message = self._stuck_message(answers)
                self.probe.tell(message)
                raise RanksDivergedError(message)

    @staticmethod
    def _deadlocked(answers, earlier) -> bool:
        """Every rank waits here, or has sat for BLOCKED_S at the same point of communication code without using the
        CPU (blocked in a collective, which needs this rank: it never ends); at least one does the latter. A rank that
        computes, even inside DeepSpeed, uses CPU time and is waited for; one that waits for a slow collective the
        others have joined moves on within BLOCKED_S. ``earlier``: each rank's first answer at its current point."""
        if earlier is None or any(a is None for a in answers):
            return False
        elsewhere = [rank for rank, a in enumerate(answers) if "check" not in a]
        return bool(elsewhere) and all(_blocked(answers[rank], earlier[rank]) for rank in elsewhere)

    def _stuck_message(self, answers) -> str:
        step, micro = next((a["check"][1], a["check"][2]) for a in answers if "check" in a)
        each = []
        for rank, answer in enumerate(answers):
            if "check" in answer:
                index, s, m = answer["check"]
                each.append(f"rank {rank}: {self._name(index)}" + (f" (step {s}, micro-step {m})"
                                                                  if (s, m) != (step, micro) else ""))
            else:
                where = " in backward" if answer["backward"] else ""
                caller = f", from {answer['caller']}" if answer["caller"] else ""
                each.append(f"rank {rank}: inside DeepSpeed's gather of {answer['what']}{where}{caller}"
                            if answer["what"] else f"rank {rank}: in a collective outside the model's gathers{caller}")
        return (f"ZeRO-3 ranks diverged at step {step}, micro-step {micro}: every rank must gather the same parameters "
                f"in the same order, but while some waited to fetch a module the others sat in a collective of their "
                f"own, which would never end ({'; '.join(each)}).{self._cause()} {self._fix()}")

    def _name_first_difference(self, step: int, micro: int) -> None:
        """The forwards' module orders differed (seen from their fingerprints): compare them and raise naming the
        first module that differs."""
        import torch.distributed as dist

        orders = [None] * self.world
        dist.all_gather_object(orders, self.order, group=self.group)
        position = next((i for i in range(max(map(len, orders)))
                         if len({tuple(o[i:i + 1]) for o in orders}) > 1), 0)
        rows = [((o[position] if position < len(o) else _FORWARD_END), step, micro) for o in orders]
        raise RanksDivergedError(self._message(rows) + f" (seen at the end of the forward: module {position + 1} of "
                                                       f"the forward's gathers differed)")

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
                f"fetch different ones ({each}).{self._cause()} {self._fix()}")

    def _cause(self) -> str:
        return f" {self.cause}" if self.cause else ""

    @staticmethod
    def _fix() -> str:
        return ("Fix: make every rank take the same path through the model in each step (the same branch, the same "
                "generate calls; for vision-language models, batches whose modalities match across ranks), or make "
                "the module that differs a ZeRO-3 leaf (deepspeed.utils.set_z3_leaf_modules), which gathers it whole "
                "on every rank. See hf_zero's docs, callback.md (divergence_check).")


def _since(answers, earlier):
    """Each rank's first answer at the point it answers from now (its earlier one where it has not moved)."""
    if earlier is None:
        return list(answers)
    return [before if now is not None and before is not None and "check" not in now and "check" not in before
            and now["at"] == before["at"] else now for now, before in zip(answers, earlier)]


def _blocked(now: dict, before) -> bool:
    if not now["comm"] or before is None or "check" in before or now["at"] != before["at"]:
        return False
    waited = now["clock"] - before["clock"]
    return waited >= BLOCKED_S and now["cpu"] - before["cpu"] < IDLE_SHARE * waited


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


def watch_fetch_order(engine, mode: str = "whole_run") -> FetchOrderWatch | None:
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
    return FetchOrderWatch(engine, host_group(WAIT_S), dist.get_world_size(), None if mode == "always" else FIRST_STEPS,
                           "remove" if mode == "first_steps" else "fingerprint")
