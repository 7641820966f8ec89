"""The trainer's prefetch thread: reads the feeds into the staging buffers in the background,
so that training never waits on input it could have had (Arrow reads, Kafka polls and SQLite
release the GIL).

It wakes only when reading can do something: while every live buffer holds its read-ahead it
sleeps until the trainer takes rows (``consumed``); a thread that polled every few ms would
take the GIL from the training thread between its kernels for nothing.

It can also prepare the minibatches the training buffers hold (``prepare``: Arrow rows into
model tensors, their windows), so that the training thread only runs the step; it yields the
GIL after each one, to take it from the training thread only while that runs kernels. (Where the
loop plans its next minibatch beside the step's backward, the step's helper builds it instead:
``loop.Trainer._start_prefetch``.)

With ``defer`` the trainer's wakes wait for its next backward pass (``release``, which the stepper
calls just before it): backward runs without the GIL for a good share of a step, so the thread
reads and prepares then rather than between the step's kernels, where every hand-over of the GIL
stalls the step. Measured on bench/train.py's 2-core machine: a minibatch prepared per step
beside a bare MTRM step loop slowed it 18-30%, the same started at backward 2%; ``bench/train.py``
went from 0.56-0.59x to 0.65-0.75x the bare loop for the single tower (MTRM: within its noise). A
trainer that does not step releases the wake at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FULL_WAIT = 0.25  # seconds a thread with full buffers sleeps unless woken (a bound, not a poll)


class Prefetcher:
    """Calls ``read()`` under ``lock`` until stopped; a failure is kept and raised in the
    training thread by ``check()`` (and by ``stop()``). ``full()`` (under the lock): every
    buffer that can still receive rows holds its read-ahead."""

    def __init__(
        self,
        read: Callable[[], bool],
        lock: threading.Lock,
        poll_interval: float,
        full: Callable[[], bool] | None = None,
        prepare: Callable[[], bool] | None = None,
        defer: bool = False,
    ):
        self.read = read
        self.lock = lock
        self.full = full
        self.prepare = prepare  # prepares one queued minibatch; False when none is queued
        self.backoff = max(0.002, min(poll_interval, 0.02))
        self.stopping = threading.Event()
        self.wanted = threading.Event()  # the trainer took rows: there may be room to read into
        self.defer = defer  # the trainer's wakes wait for its next backward pass (``release``)
        self.due = False  # a deferred wake (the loop sets it, on the step's helper thread too: at worst a step late)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="primus-prefetch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.wanted.clear()  # before reading: a wake while it reads or prepares is not lost
                with self.lock:
                    arrived = self.read()
                    full = not arrived and self.full is not None and self.full()
                # reading first: a wake (rows taken) interrupts preparing
                while self.prepare is not None and not self.wanted.is_set() and self.prepare():
                    time.sleep(0)  # let the training thread have the GIL back between minibatches
                # read() stops where the buffers are full or the sources have nothing: reading again at
                # once finds nothing (half of this thread's rounds did). It waits for the trainer to take
                # rows or move read ones in (``consumed``), or backs off; it never spins
                self.wanted.wait(FULL_WAIT if full else self.backoff)
        except BaseException as exc:  # surfaced in the training thread by check()
            self.error = exc

    def consumed(self) -> None:
        """The trainer took rows from a buffer below its read-ahead (read now), or moved rows
        into its buffers (prepare them): wake the thread, or with ``defer`` at the next ``release``."""
        if self.defer:
            self.due = True
        else:
            self.wanted.set()

    def release(self) -> None:
        """The training thread is about to run a backward pass, or will not step now: a deferred wake goes."""
        if self.due:
            self.due = False
            self.wanted.set()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"prefetch thread failed: {self.error}") from self.error

    def stop(self) -> None:
        self.stopping.set()
        self.wanted.set()
        self.thread.join(timeout=30)
        self.check()
