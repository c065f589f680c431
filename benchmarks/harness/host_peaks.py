"""Which code raised the host's memory high-water mark, and by how much.

Offload keeps most of a run in host memory, and the figure that matters is its peak (ru_maxrss): a buffer that
lives for a moment at engine start counts as much as one that lives all run. ``HostPeakSampler`` reads this
process's resident size every few milliseconds on a thread; each time it passes the highest value seen by more
than ``step`` bytes it notes what the main thread was running then. The rises, grouped by that code, say where
the peak came from. Most large allocations and copies in torch release the GIL, so the sampler sees them
happen; a rise inside code that holds the GIL is credited to the code that runs next.
"""

import os
import sys
import threading
import time
from collections import defaultdict

from benchmarks.harness.peak_memory import label
from hf_zero.planner import GIB

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _frames(frame, depth: int = 40) -> list:
    """The stack of ``frame``, innermost first, as the CUDA snapshot's frames are (filename, line, name)."""
    frames = []
    while frame is not None and len(frames) < depth:
        frames.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno, "name": frame.f_code.co_name})
        frame = frame.f_back
    return frames


class HostPeakSampler:
    """Samples resident memory on a daemon thread between ``start()`` and ``stop()``; ``phase`` labels the rises."""

    def __init__(self, interval_s: float = 0.005, step: int = 128 * 1024**2):
        self.interval_s, self.step = interval_s, step
        self.phase = "init"
        self.rises = []  # (seconds since start, resident bytes, bytes added, phase, code)
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hf-zero-host-peaks", daemon=True)

    def start(self) -> "HostPeakSampler":
        self._start_time = time.perf_counter()
        self._high = self._max = self._base = resident_bytes()
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self._sample()  # a rise in the last interval
        return self.summary()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        rss = resident_bytes()
        self._max = max(self._max, rss)
        if rss < self._high + self.step:
            return
        frame = sys._current_frames().get(self._main)
        code = label(_frames(frame)) if frame is not None else "main thread gone"
        self.rises.append((time.perf_counter() - self._start_time, rss, rss - self._high, self.phase, code))
        self._high = rss

    def summary(self, top: int = 12) -> dict:
        """The peak, and the bytes each (phase, code) added on the way to it, largest first."""
        added = defaultdict(int)
        for _, _, grown, phase, code in self.rises:
            added[(phase, code)] += grown
        ranked = sorted(added.items(), key=lambda item: -item[1])
        return {"start_gib": self._base / GIB, "peak_gib": self._max / GIB, "step_gib": self.step / GIB,
                "rises": [{"phase": phase, "code": code, "gib": grown / GIB} for (phase, code), grown in ranked[:top]],
                "other_gib": sum(grown for _, grown in ranked[top:]) / GIB,
                "timeline": [{"s": round(t, 2), "rss_gib": rss / GIB, "phase": phase, "code": code}
                             for t, rss, _, phase, code in self.rises]}
