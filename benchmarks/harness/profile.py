"""Where a training step's time goes: compute, communication, exposed communication, idle GPU, Python hooks.

``StepProfiler`` runs torch.profiler over a few steps *after* the timed ones (the profiler slows what it
watches, so it never touches the median): once for the GPU timeline, once more with Python tracing so
DeepSpeed's and FSDP's hooks show up as functions. ``summarize`` reads the Chrome trace that torch writes and reduces it to per-step
milliseconds. Communication counts as *exposed* where a NCCL kernel runs and no compute kernel does: the
time overlap did not hide. GPU idle is the part of the step with no kernel at all, which is where Python
work (hooks, launches, synchronisation) shows on the GPU timeline.
"""

import gzip
import json
from collections import defaultdict
from pathlib import Path

from transformers import TrainerCallback

# Which code a Python frame belongs to, by the path in its trace name ("deepspeed/runtime/engine.py(2883): train");
# first match wins, and frames of other code count as "python (other)"
FRAMEWORKS = {"deepspeed": "deepspeed/", "fsdp": "torch/distributed/fsdp/", "ddp": "torch/nn/parallel/",
              "hf_zero": "hf_zero/", "transformers": "transformers/", "torch python": "torch/"}
TORCH_OPS = "torch ops"  # time inside ATen operators (their C++ work and kernel launches), whoever called them
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


class StepProfiler(TrainerCallback):
    """Profile ``active`` steps that start after step ``after`` (one profiler warm-up step in between), twice:
    first the GPU timeline alone (``trace_path``), then with Python tracing (``python_trace_path``), which
    names the code on the training thread but roughly doubles a hook-heavy step, so its timings never
    enter the GPU numbers."""

    def __init__(self, trace_path, python_trace_path, after: int, active: int):
        self.paths = [Path(trace_path), Path(python_trace_path)]
        self.after, self.active = after, active
        self.profiler, self.phase, self.written = None, 0, []

    @staticmethod
    def extra_steps(active: int) -> int:
        return 2 * (1 + active)  # two phases of one warm-up step and ``active`` profiled ones

    def _start(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        wait = self.after if self.phase == 0 else 0
        self.profiler = profile(activities=activities, with_stack=self.phase == 1,
                                schedule=schedule(wait=wait, warmup=1, active=self.active, repeat=1),
                                on_trace_ready=self._write)
        self.profiler.start()

    def _write(self, prof):
        # a .gz name makes torch gzip it: a ZeRO-3 step with Python tracing is tens of MB of JSON
        prof.export_chrome_trace(str(self.paths[self.phase]))
        self.written.append(self.paths[self.phase])

    def on_train_begin(self, args, state, control, **kwargs):
        self._start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is None:
            return
        self.profiler.step()
        if len(self.written) > self.phase:  # this phase's trace is out
            self.profiler.stop()
            self.profiler, self.phase = None, self.phase + 1
            if self.phase < len(self.paths):
                self._start()

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None

    def summary(self) -> dict:
        if len(self.written) < 2:
            return {"error": f"the profiler wrote {len(self.written)} of 2 traces (too few steps?)"}
        return {**summarize(load_trace(self.paths[0]), self.active),
                **summarize_python(load_trace(self.paths[1]), self.active)}


def union(intervals) -> list:
    """Merge (start, end) intervals into disjoint sorted ones."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def length(intervals) -> float:
    return sum(end - start for start, end in intervals)


def subtract(a, b) -> list:
    """Parts of the disjoint sorted intervals ``a`` that no interval of ``b`` (disjoint, sorted) covers."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append([cursor, b[k][0]])
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append([cursor, end])
    return out


def load_trace(path) -> list:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def owner(event: dict) -> str | None:
    """Who owns time spent in this frame; None for a builtin (isinstance, dict.get): its caller does."""
    if event.get("cat") == "cpu_op":
        return TORCH_OPS
    if event["name"].startswith("<built-in"):
        return None
    return next((name for name, marker in FRAMEWORKS.items() if marker in event["name"]), "python (other)")


def self_time(spans: list, window: tuple) -> dict:
    """Microseconds of the training thread's time inside ``window`` that each framework's own code spent
    (the innermost frame owns each moment): Python hook overhead shows here, apart from the operators it calls."""
    by_thread = defaultdict(int)
    for e in spans:
        if e.get("cat") == "cpu_op":
            by_thread[(e.get("pid"), e.get("tid"))] += 1
    if not by_thread:
        return {}
    main = max(by_thread, key=by_thread.get)  # the thread that launched the most operators runs the step
    lo, hi = window
    frames = sorted(((max(e["ts"], lo), min(e["ts"] + e["dur"], hi), owner(e)) for e in spans
                     if e.get("cat") in ("python_function", "cpu_op") and (e.get("pid"), e.get("tid")) == main
                     and e["ts"] < hi and e["ts"] + e["dur"] > lo), key=lambda f: (f[0], -f[1]))
    totals, stack, cursor = defaultdict(float), [], lo
    for start, end, who in frames:
        while stack and stack[-1][0] <= start:  # frames that ended before this one began
            done_end, done_who = stack.pop()
            totals[done_who] += max(0.0, done_end - cursor)
            cursor = max(cursor, done_end)
        if stack:
            totals[stack[-1][1]] += max(0.0, start - cursor)
        cursor = max(cursor, start)
        if who is None:
            who = stack[-1][1] if stack else "python (other)"
        end = min(end, stack[-1][0]) if stack else end  # a child never outlives its parent (clock jitter)
        stack.append((end, who))
    while stack:
        done_end, done_who = stack.pop()
        totals[done_who] += max(0.0, done_end - cursor)
        cursor = max(cursor, done_end)
    return dict(totals)


def is_communication(kernel_name: str) -> bool:
    return "nccl" in kernel_name.lower()


def _spans(events: list) -> list:
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def step_window(spans: list, steps: int) -> tuple:
    """((start, end), steps) of the profiled steps in µs: the CPU side of torch's ProfilerStep marks (the step
    as the training loop sees it), else the GPU work's extent."""
    # the CPU-side marks only: the same names come again on the GPU timeline (cat gpu_user_annotation)
    marked = [e for e in spans if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    if marked:
        return (min(e["ts"] for e in marked), max(e["ts"] + e["dur"] for e in marked)), len(marked)
    gpu = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if gpu:
        return (min(e["ts"] for e in gpu), max(e["ts"] + e["dur"] for e in gpu)), steps
    return (0.0, 0.0), steps


def summarize_python(events: list, steps: int) -> dict:
    """From a trace with Python tracing: the traced step's length and each framework's own time in it (ms)."""
    spans = _spans(events)
    window, steps = step_window(spans, steps)
    per_step = max(steps, 1) * 1000
    return {"python_traced_step_ms": (window[1] - window[0]) / per_step,
            "cpu_self_ms": {name: us / per_step for name, us in sorted(self_time(spans, window).items())}}


def summarize(events: list, steps: int) -> dict:
    """Per-step milliseconds of the GPU timeline from Chrome-trace events (times in microseconds), over
    ``steps`` profiled steps."""
    spans = _spans(events)
    gpu = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = [e for e in gpu if e["cat"] == "kernel"]
    window, steps = step_window(spans, steps)

    def clipped(selected):  # GPU intervals inside the window (a kernel queued before it may end inside)
        return union((max(e["ts"], window[0]), min(e["ts"] + e["dur"], window[1])) for e in selected
                     if e["ts"] < window[1] and e["ts"] + e["dur"] > window[0])

    comm = clipped(e for e in kernels if is_communication(e["name"]))
    compute = clipped(e for e in kernels if not is_communication(e["name"]))
    busy = clipped(gpu)
    per_step = lambda us: us / 1000 / max(steps, 1)  # noqa: E731  (µs over the window -> ms per step)

    sync = union((e["ts"], e["ts"] + e["dur"]) for e in spans
                 if e.get("cat") == "cuda_runtime" and e["name"] in _SYNC_CALLS)

    totals = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        entry = totals[e["name"]]
        entry[0] += e["dur"]
        entry[1] += 1
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:12]
    # by direction and host memory kind ("Memcpy DtoH (Device -> Pageable)"): a pageable copy is synchronous
    # and slow, the sign that an offload buffer lost its pinning
    copies = defaultdict(lambda: [0.0, 0])
    for e in gpu:
        if e["cat"] == "gpu_memcpy":
            entry = copies[e["name"]]
            entry[0] += e["dur"]
            entry[1] += (e.get("args") or {}).get("bytes", 0)
    return {
        "steps": steps,
        "step_ms": per_step(window[1] - window[0]),
        "gpu_busy_ms": per_step(length(busy)),
        "compute_ms": per_step(length(compute)),
        "comm_ms": per_step(length(comm)),
        "exposed_comm_ms": per_step(length(subtract(comm, compute))),
        "idle_ms": per_step(max(0.0, (window[1] - window[0]) - length(busy))),
        "memcpy_ms": per_step(sum(e["dur"] for e in gpu if e["cat"] != "kernel")),
        "cpu_sync_ms": per_step(length(sync)),
        "copies": {name: {"ms_per_step": per_step(us), "gib_per_step": size / 2**30 / max(steps, 1)}
                   for name, (us, size) in sorted(copies.items())},
        "top_kernels": [{"name": name[:120], "ms_per_step": per_step(total), "calls_per_step": calls / max(steps, 1),
                         "communication": is_communication(name)} for name, (total, calls) in top],
    }
