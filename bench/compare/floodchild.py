"""The flood child: launch 1 writes a fatal line idle, beside a flood, or inside one.

    floodchild.py DIR idle|runs-on|other-stream|same-stream [SGLANG ARGS...]

Launch 1 (still starting: no ready line) writes SGLang-like log lines to stdout as fast as
the pipe takes them (`other-stream`, `same-stream`) or nothing (`idle`, `runs-on`); after
FLOOD_S it writes the fatal traceback of reactchild.py (the `fa3-requires-sm80-sm90` line,
one write of whole lines): on stderr (`idle`, `runs-on`, `other-stream`) or into the stdout
flood between two chunks (`same-stream`), and then stamps the CLOCK_MONOTONIC read just
before that write in DIR/fatal (SIGTERM, which only the main thread takes, held off until it
is there). `runs-on` then computes for RUN_ON_S, as SGLang's scheduler goes on after its fatal
traceback (srt/managers/scheduler.py:6372-6373 on 0.5.23: it logs it, signals its parent
and exits; the parent's handler then stops the tree), where `idle` sleeps. It writes its
pid to DIR/pid; SIGTERM is not handled, so it ends the process at once, and the bench sees
that end on a pidfd (a Python-level handler would run only when the main thread next runs
bytecode). Later launches print the ready line and wait.

Where DIR/arrival is a FIFO (the bench's `arrival` runs), launch 1 instead gives SIGTERM a
Python-level handler and the FIFO to `signal.set_wakeup_fd`: CPython's C-level handler writes
a byte there as the signal is delivered, before any bytecode runs, and the bench reads when
the SIGTERM reached the child (issue 24's measure) rather than when the child ended. The
handler then ends the process with SIGTERM at its default action.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from reactchild import CRASH, READY, SPECIFIC

FLOOD_S = 0.5
AFTER_S = 1.0  # the flood goes on this long after the fatal line, at most (bounds the disk)
RUN_ON_S = 0.02  # `runs-on`: the CPU time after the fatal line (SIGTERM ends it before)
LINE = (b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 512, "
        b"#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0\n")
CHUNK = LINE * (65536 // len(LINE))
FATAL = ("\n".join([CRASH, '  File "scheduler.py", line 1, in run_scheduler_process', SPECIFIC])
         + "\n").encode()


def _end(_sig: int, _frame: FrameType | None) -> None:
    """After the C-level handler wrote the arrival: end as SIGTERM's default action does."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)


def main() -> int:
    """One launch."""
    workdir, mode = Path(sys.argv[1]), sys.argv[2]
    fd = os.open(workdir / "launches", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (" ".join(sys.argv[3:]) + "\n").encode())
    os.close(fd)
    if len((workdir / "launches").read_text().splitlines()) > 1:
        print(READY, flush=True)
        threading.Event().wait()
        return 0

    arrival = workdir / "arrival"
    if arrival.is_fifo():  # the bench holds the read end open: no ENXIO
        signal.set_wakeup_fd(os.open(arrival, os.O_WRONLY | os.O_NONBLOCK))
        signal.signal(signal.SIGTERM, _end)
    (workdir / "pid.tmp").write_text(str(os.getpid()))
    (workdir / "pid.tmp").replace(workdir / "pid")  # the bench watches this pid's end
    lock = threading.Lock()  # a stdout write is never cut by the fatal write
    flooding = mode in ("other-stream", "same-stream")

    stop_at = time.monotonic() + FLOOD_S + AFTER_S

    def flood() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the main thread's, only
        while time.monotonic() < stop_at:
            with lock:
                os.write(1, CHUNK)

    if flooding:
        threading.Thread(target=flood, daemon=True).start()
    tmp, stamp = os.fsencode(workdir / "fatal.tmp"), os.fsencode(workdir / "fatal")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    time.sleep(FLOOD_S)
    # The clock is read just before the fatal write and the stamp written after it, with
    # SIGTERM held off until the stamp is whole (renamed into place). Its file is opened
    # before: held off are one write and one rename (~20 us). The whole of `_stamp` (~0.2 ms
    # of Python's open, write and rename) held SIGTERM off where a supervisor that preempts
    # the child at its fatal write signals before the stamp is there: that supervisor's
    # SIGTERM waited for it, one that came later did not (bench/README.md, "The idle
    # reaction: the reader's slice").
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with lock:
        at = time.monotonic()
        os.write(1 if mode == "same-stream" else 2, FATAL)
    os.write(fd, repr(at).encode())
    os.rename(tmp, stamp)  # noqa: PTH104 - paths encoded before: least work held off
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(fd)
    if mode == "runs-on":
        until = time.monotonic() + RUN_ON_S
        while time.monotonic() < until:
            pass
    time.sleep(30)  # SIGTERM ends it well before
    return 1


if __name__ == "__main__":
    sys.exit(main())
