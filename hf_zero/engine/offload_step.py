"""The host's part of a ZeRO-1/2 offload optimizer step, run in chunks, and on one GPU finished inside the next
forward. engine_fixes decides where this applies; this module does it.

DeepSpeed 0.19.8's step() calls, for each parameter group i: ``unscale_and_clip_grads([master_i.grad], norm)``, then
``_optimizer_step(i)`` (DeepSpeedCPUAdam over the whole fp32 partition), then rounds ``master_i`` into a pinned 16-bit
buffer and copies the buffer to the GPU partition. Here the unscale is held back and ``_optimizer_step`` makes a
``GroupStepInChunks``, which unscales, updates, rounds and copies one chunk at a time: at once, or on one GPU in the
next forward, chunk by chunk before the layers that need them (``StepFinishedInForward``).
"""

import functools

import torch


class GroupStepInChunks:
    """One DeepSpeedCPUAdam step of the fp32 partition ``master`` (its gradient in ``master.grad``), run ``chunk``
    elements at a time by ``run_until``: the gradient chunk multiplied by ``factor`` (None: left as is), the Adam
    update, the rounding into ``staging`` (pinned, 16-bit) and a non-blocking copy into ``target``.

    The step's number and hyperparameters are taken when it is made, as DeepSpeedCPUAdam.step takes them: a
    scheduler that changes the learning rate afterwards changes the next step's. Adam's state must exist."""

    def __init__(self, adam, group: dict, master, staging, target, factor, chunk: int):
        self.adam, self.master, self.staging, self.target, self.factor, self.chunk = (
            adam, master, staging, target, factor, chunk)
        self.state = adam.state[master]
        self.state["step"] += 1
        beta1, beta2 = group["betas"]
        self.hyperparameters = (self.state["step"], group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                                group["bias_correction"])
        self.done = 0  # elements stepped so far

    @property
    def finished(self) -> bool:
        return self.done >= self.master.numel()

    def run_until(self, end: int | None = None) -> None:
        """Step the chunks that hold elements below ``end`` (all of them by default)."""
        end = self.master.numel() if end is None else min(end, self.master.numel())
        grad, state = self.master.grad, self.state
        while self.done < end:
            piece = slice(self.done, self.done + self.chunk)
            if self.factor is not None:
                grad.data[piece].mul_(self.factor)
            self.adam.ds_opt_adam.adam_update(self.adam.opt_id, *self.hyperparameters, self.master.data[piece],
                                              grad.data[piece], state["exp_avg"][piece], state["exp_avg_sq"][piece])
            self.staging[piece].copy_(self.master.data[piece])
            self.target[piece].copy_(self.staging[piece], non_blocking=True)
            self.done = min(self.done + self.chunk, self.master.numel())


def step_partition_in_chunks(adam, group: dict, master, staging, target, factor, chunk: int) -> None:
    """One whole chunked step of ``master`` (GroupStepInChunks), now."""
    GroupStepInChunks(adam, group, master, staging, target, factor, chunk).run_until()


class StepFinishedInForward:
    """Holds each parameter group's chunked step until the model needs it: a forward pre-hook on every module with
    trained parameters steps the chunks that hold them before the module runs, so the host steps layer k+1 while the
    GPU computes layer k. On one GPU only: the 16-bit partition is the whole model there, and nothing gathers it.

    Everything that reads or replaces the weights or the optimizer's state outside a forward finishes the step
    first: the end of the model's forward, ``state_dict()`` and ``load_state_dict()`` of the model or a hooked
    module, and the optimizer's ``state_dict``, ``load_state_dict`` and ``step``; ``finish()`` does it on demand
    (ZeroCallback calls it at train end)."""

    def __init__(self, optimizer, module):
        self.pending = {}  # parameter group -> GroupStepInChunks not yet finished
        ends = {}  # id(parameter) -> (its group, the end of its elements in the group's flat 16-bit buffer)
        for i, params in enumerate(optimizer.bit16_groups):
            flat = optimizer.bit16_groups_flat[i]
            for param in params:
                start = (param.data_ptr() - flat.data_ptr()) // param.element_size()
                ends[id(param)] = (i, start + param.numel())
        for submodule in module.modules():
            needs = {}
            for param in submodule.parameters(recurse=False):
                if id(param) in ends:
                    group, end = ends[id(param)]
                    needs[group] = max(needs.get(group, 0), end)
            if needs:
                submodule.register_forward_pre_hook(functools.partial(self._run_for, needs))
            if needs or submodule is module:
                # reading the weights finishes the step; so does loading them, or the held step would overwrite them
                submodule.register_state_dict_pre_hook(self._finish_hook)
                submodule.register_load_state_dict_pre_hook(self._finish_hook)
        module.register_forward_hook(self._finish_hook)
        for name in ("state_dict", "load_state_dict", "step"):
            setattr(optimizer, name, self._finishing_first(getattr(optimizer, name)))

    def hold(self, group: int, work: GroupStepInChunks) -> None:
        left_over = self.pending.pop(group, None)  # none in training: the forward in between finished it
        if left_over is not None:
            left_over.run_until()
        self.pending[group] = work

    def finish(self) -> None:
        for group in list(self.pending):
            self.pending.pop(group).run_until()

    def _run_for(self, needs: dict, module, args) -> None:
        if not self.pending:
            return
        for group, end in needs.items():
            work = self.pending.get(group)
            if work is not None:
                work.run_until(end)
                if work.finished:
                    del self.pending[group]

    def _finish_hook(self, *args, **kwargs) -> None:
        self.finish()

    def _finishing_first(self, method):
        @functools.wraps(method)
        def finished_first(*args, **kwargs):
            self.finish()
            return method(*args, **kwargs)

        return finished_first


def step_offloaded_groups_in_chunks(optimizer, chunk: int, finish_in_forward_of=None) -> StepFinishedInForward | None:
    """Replaces the ZeRO-1/2 optimizer's ``unscale_and_clip_grads`` and ``_optimizer_step`` so that step() runs each
    parameter group's host work in chunks; with ``finish_in_forward_of`` (the engine's module, one GPU), the chunks
    run in that module's next forward instead (StepFinishedInForward, returned).

    Once a group's chunks have run or are held, and until step() has made its own two copies, the group's entries in
    ``single_partition_of_fp32_groups`` and ``param_buffer_of_bit16_for_cpu_offload_groups`` both name the GPU
    partition, so those copies are of a tensor onto itself, which torch returns from at once; the next group's
    unscale, or ``reset_cpu_buffers()`` at the end of step(), puts the lists back."""
    from deepspeed import comm as dist

    unscale, optimizer_step = optimizer.unscale_and_clip_grads, optimizer._optimizer_step
    masters, buffers = optimizer.single_partition_of_fp32_groups, optimizer.param_buffer_of_bit16_for_cpu_offload_groups
    held_norms, lent = {}, {}  # group -> the norm its unscale was held with; group -> (master, buffer) lent out
    later = StepFinishedInForward(optimizer, finish_in_forward_of) if finish_in_forward_of is not None else None

    def give_back():
        for i, (master, buffer) in lent.items():
            masters[i], buffers[i] = master, buffer
        lent.clear()

    def unscale_later(grad_groups_flat, total_norm):
        give_back()
        held = [i for i, master in enumerate(masters)
                if len(grad_groups_flat) == 1 and grad_groups_flat[0] is master.grad]
        if not held:
            return unscale(grad_groups_flat, total_norm)
        held_norms[held[0]] = total_norm

    def step_group(group_no):
        give_back()
        master = masters[group_no]
        held = group_no in held_norms
        norm = held_norms.pop(group_no, None)
        if not optimizer.optimizer.state[master]:  # the first step: DeepSpeed's CPU Adam creates the moments
            if held:
                unscale([master.grad], norm)
            return optimizer_step(group_no)
        factor = None  # the factor DeepSpeed's unscale multiplies by, read off a probe of 1.0
        if held and not (optimizer.clip_grad == 0.0 and optimizer.loss_scale == 1.0):
            factor = torch.ones((), dtype=master.grad.dtype)
            unscale([factor], norm)
        partition_id = dist.get_rank(group=optimizer.real_dp_process_group[group_no])
        target = optimizer.parallel_partitioned_bit16_groups[group_no][partition_id]
        work = GroupStepInChunks(optimizer.optimizer, optimizer.optimizer.param_groups[group_no], master,
                                 buffers[group_no], target, factor, chunk)
        if later is None:
            work.run_until()
        else:
            later.hold(group_no, work)
        optimizer._lazy_init_hp_params_optimizer_state()
        lent[group_no] = (master, buffers[group_no])
        masters[group_no] = buffers[group_no] = target

    optimizer.unscale_and_clip_grads, optimizer._optimizer_step = unscale_later, step_group
    reset = optimizer.reset_cpu_buffers

    def reset_cpu_buffers():
        give_back()
        return reset()

    optimizer.reset_cpu_buffers = reset_cpu_buffers
    return later
