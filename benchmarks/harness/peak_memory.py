"""What is allocated at a step's memory peak, and which code allocated it.

``PeakMemoryRecorder`` records the CUDA caching allocator's history (``torch.cuda.memory._record_memory_history``,
Python stacks only) over one step after the timed ones, then ``peak_breakdown`` replays that history: the
moment the allocated bytes peak, and the blocks alive then, grouped by the first frame outside torch that
asked for them (a DeepSpeed buffer, a transformers layer's activation). Blocks allocated before the
recording started (weights, optimizer states, persistent buffers) are one line. Allocations made by
autograd's backward thread carry no Python frame and are grouped as such.
"""

from collections import defaultdict

from transformers import TrainerCallback

BEFORE = "allocated before the step (weights, optimizer states, buffers)"
NO_FRAME = "no Python frame (autograd's backward thread)"
# frames of these paths say how, not who: the first frame outside them names the owner
_PLUMBING = ("torch/", "contextlib.py", "functools.py")
MAX_EVENTS = 2_000_000  # the history is a ring buffer: a full one has lost the step's first events


def label(frames: list) -> str:
    """The allocating code: innermost frame outside torch and the standard plumbing, as path:line (function)."""
    if not frames:
        return NO_FRAME
    owner = next((f for f in frames if not any(p in f["filename"] for p in _PLUMBING)), frames[0])
    path = owner["filename"]
    for root in ("site-packages/", "dist-packages/"):
        path = path.split(root, 1)[-1]
    return f"{path}:{owner['line']} ({owner['name']})"


def peak_breakdown(trace: list, before: int, top: int = 12) -> dict:
    """Replay allocator events (``alloc`` adds a block, ``free_completed`` returns it) from ``before`` bytes
    allocated at the start; return the peak and the bytes alive at it by allocating code, largest first."""
    live, freed_before = {}, 0
    current = peak = before
    peak_live, peak_freed_before = {}, 0
    for event in trace:
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames") or [])
            current += event["size"]
            if current > peak:
                peak, peak_live, peak_freed_before = current, dict(live), freed_before
        elif action == "free_completed":
            if live.pop(event["addr"], None) is None:
                freed_before += event["size"]  # a block from before the recording
            current -= event["size"]
    by_owner = defaultdict(int)
    for size, frames in peak_live.values():
        by_owner[label(frames)] += size
    ranked = sorted(by_owner.items(), key=lambda kv: -kv[1])
    rows = [{"owner": BEFORE, "bytes": before - peak_freed_before}]
    rows += [{"owner": owner, "bytes": size} for owner, size in ranked[:top]]
    rest = sum(size for _, size in ranked[top:])
    if rest:
        rows.append({"owner": f"{len(ranked) - top} other allocating lines", "bytes": rest})
    return {"peak_bytes": peak, "rows": rows}


class PeakMemoryRecorder(TrainerCallback):
    """Record the allocator's history during optimizer step ``step`` (0-based) and keep its peak breakdown."""

    def __init__(self, step: int):
        self.step, self.recording, self.before = step, False, 0
        self.summary = None

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        if state.global_step != self.step:
            return
        if not torch.cuda.is_available():
            self.summary = {"note": "CUDA only: torch records the allocator's history on GPUs"}
            return
        torch.cuda.synchronize()
        self.before = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=MAX_EVENTS)
        self.recording = True

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        if not self.recording:
            return
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        self.recording = False
        trace = snapshot["device_traces"][torch.cuda.current_device()]
        if len(trace) >= MAX_EVENTS:
            self.summary = {"note": f"over {MAX_EVENTS} allocator events in one step: the history lost its start"}
            return
        self.summary = peak_breakdown(trace, self.before)
        self.summary["events"] = len(trace)
