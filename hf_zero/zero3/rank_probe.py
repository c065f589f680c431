"""Ask every rank where its training thread is while this one waits, to tell a slow rank from a deadlocked one.

A rank waiting in hf_zero's divergence check cannot see why the others do not come: one may be saving or logging
(it will come), another may sit in one of DeepSpeed's collectives that needs this very rank (it never will; gloo's and
NCCL's own timeouts are 10 to 30 minutes). Each rank runs a small daemon thread that polls a counter in the process
group's store (one store round trip every ``POLL_S``; no GPU work) and, when a waiting rank raises it, answers with
where its training thread stands: waiting in the check, or blocked in a collective (read from the thread's Python
stack: the module whose gather it waits for, or the parameter a forward read directly), or running. A verdict the
waiting rank posts is printed by every rank's thread, so each rank's log names every rank's position even when its
own training thread never returns from the collective.
"""

import json
import os
import sys
import sysconfig
import threading
import time

from ..compat.deepspeed_api import gather_target

# How often each rank's thread looks for a question: detection comes one to two polls after a rank stops moving
POLL_S = 0.5
# How long a waiting rank waits for every rank's answer (a thread that holds no GIL answers within one poll)
ANSWER_S = 3.0
_WATCHES = [0]  # probes made in this process: every rank makes them in the same order, so the keys match

# A training thread whose innermost Python frame is in one of these waits in a collective (or its handle's wait)
# (DeepSpeed's nvtx wrapper calls its collectives and their waits directly; hf_zero's arrival waits wait on the others)
_COMM_FILES = (f"{os.sep}torch{os.sep}distributed{os.sep}", f"{os.sep}deepspeed{os.sep}comm{os.sep}",
               f"{os.sep}deepspeed{os.sep}runtime{os.sep}zero{os.sep}", f"{os.sep}deepspeed{os.sep}utils{os.sep}nvtx.py",
               f"{os.sep}hf_zero{os.sep}distributed.py")
# Frames that are not the user's code: the standard library, installed packages, and these libraries where they are
# checked out rather than installed
_LIBRARIES = (sysconfig.get_paths()["stdlib"], f"{os.sep}site-packages{os.sep}", f"{os.sep}torch{os.sep}", f"{os.sep}deepspeed{os.sep}", f"{os.sep}transformers{os.sep}",
              f"{os.sep}accelerate{os.sep}", f"{os.sep}hf_zero{os.sep}", f"{os.sep}trl{os.sep}",
              f"{os.sep}peft{os.sep}")


def _module_names(model) -> dict:
    return {id(module): name or "the model" for name, module in model.named_modules()}


def describe_stack(frame, names: dict) -> dict:
    """Where a thread stopped, from its innermost Python ``frame`` outward: whether it waits in a collective, and
    what for (the module DeepSpeed gathers, or a parameter read directly in a forward), and the user's code that led
    there. ``names``: id(module) -> its name in the model."""
    innermost = frame
    comm = innermost is not None and any(part in innermost.f_code.co_filename for part in _COMM_FILES)
    what, caller, backward = None, None, False
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if what is None:
            what = gather_target(frame, names)
        if "backward" in code.co_name and f"{os.sep}deepspeed{os.sep}" in path:
            backward = True
        if caller is None and not any(part in path for part in _LIBRARIES):
            caller = f"{os.path.basename(path)}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return {"comm": bool(comm), "what": what, "backward": backward, "caller": caller,
            "at": [id(innermost), innermost.f_lineno] if innermost is not None else None}


class RankProbe:
    """This rank's side of the questions: a daemon thread that answers them; ``ask`` asks every rank."""

    def __init__(self, store, rank: int, world: int, model, waiting):
        """``waiting()``: this rank's position while its training thread waits in the check (None otherwise)."""
        import torch.distributed as dist

        _WATCHES[0] += 1
        self.store = dist.PrefixStore(f"hf_zero/divergence/{_WATCHES[0]}/", store)
        self.rank, self.world, self.waiting = rank, world, waiting
        self.names = _module_names(model)
        self.thread_id = threading.get_ident()  # the training thread (set again at each check)
        self.verdict = None
        self._stop = threading.Event()
        self._answered = self._told = 0
        self._thread = threading.Thread(target=self._serve, name="hf_zero-divergence-probe", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * POLL_S)

    def _state(self) -> dict:
        position = self.waiting()
        if position is not None:
            return {"check": position}
        frame = sys._current_frames().get(self.thread_id)
        state = describe_stack(frame, self.names)
        # the training thread's CPU time: a thread blocked in a collective uses none
        state.update(clock=time.monotonic(), cpu=time.clock_gettime(time.pthread_getcpuclockid(self.thread_id)))
        return state

    def _serve(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                asked = self.store.add("asked", 0)
                if asked > self._answered:
                    state = json.dumps(self._state())
                    for question in range(self._answered + 1, asked + 1):
                        self.store.set(f"answer/{question}/{self.rank}", state)
                    self._answered = asked
                if self.store.add("verdicts", 0) > self._told:
                    self._told += 1
                    self.verdict = self.store.get("verdict").decode()
                    sys.stderr.write(f"hf_zero: rank {self.rank} stops: {self.verdict}\n")
                    sys.stderr.flush()
                    self.store.set(f"heard/{self.rank}", "1")
                    if self.waiting() is None:
                        _raise_in(self.thread_id, self.verdict)
                    return
        except Exception:  # the store went away with the process group: nothing left to answer
            return

    def ask(self) -> list:
        """Every rank's answer (None for a rank whose thread did not answer within ANSWER_S: its training thread
        holds the interpreter, so it runs)."""
        question = self.store.add("asked", 1)
        keys = [f"answer/{question}/{rank}" for rank in range(self.world)]
        deadline = time.monotonic() + ANSWER_S
        answers = [None] * self.world
        while time.monotonic() < deadline:
            for rank, key in enumerate(keys):
                if answers[rank] is None and self.store.check([key]):
                    answers[rank] = json.loads(self.store.get(key))
            if all(a is not None for a in answers):
                break
            time.sleep(POLL_S / 5)
        return answers

    def tell(self, verdict: str) -> None:
        """Post ``verdict`` to every rank's thread and give them up to ANSWER_S to print it."""
        self.store.set("verdict", verdict)
        self.store.add("verdicts", 1)
        keys = [f"heard/{rank}" for rank in range(self.world) if rank != self.rank]
        deadline = time.monotonic() + ANSWER_S
        # polled, not store.wait: a blocking wait would hold the store's client lock that this rank's thread needs
        while time.monotonic() < deadline and not self.store.check(keys):
            time.sleep(POLL_S / 5)


def _raise_in(thread_id: int, verdict: str) -> None:
    """Make the training thread raise RanksDivergedError(verdict) as soon as it runs Python again: it sits in a
    collective that the others never join, which fails once the waiting rank exits (or at the group's timeout)."""
    import ctypes

    from ..errors import RanksDivergedError

    stopped = type("RanksDivergedError", (RanksDivergedError,), {"__init__": lambda self: RanksDivergedError.__init__(
        self, verdict)})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(stopped))
