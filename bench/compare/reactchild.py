"""The reaction child: launch 1 fails like SGLang's scheduler, later launches serve.

    reactchild.py DIR specific|catchall [SGLANG ARGS...]

Launch 1 writes a fatal log line (stamping CLOCK_MONOTONIC, which every process shares, in
DIR/fatal), then does what SGLang 0.5.23 does after `Scheduler hit an exception`: the main
process sleeps 5 s "before crash diagnostics" (srt/managers/tokenizer_manager.py:3483) and
then kills its tree, exiting. Later launches stamp DIR/running-N, print the ready line and
wait for SIGTERM. SIGTERM is not handled: it ends the process at once, so a supervisor's
grace period never comes into play.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

CRASH = "[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):"
SPECIFIC = ("ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
            "Please use `--attention-backend flashinfer`.")
READY = "The server is fired up and ready to roll!"


def _stamp(path: Path, at: float | None = None) -> None:
    """Write CLOCK_MONOTONIC (now, or `at`) to `path`, renamed into place: readers never
    see it empty."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(repr(time.monotonic() if at is None else at))
    tmp.replace(path)


def main() -> int:
    """One launch."""
    workdir, mode = Path(sys.argv[1]), sys.argv[2]
    fd = os.open(workdir / "launches", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (" ".join(sys.argv[3:]) + "\n").encode())
    os.close(fd)
    launch = len((workdir / "launches").read_text().splitlines())
    if launch == 1:
        print("[2026-01-01 00:00:00] Load weight end. mem usage=0.01 GB", flush=True)
        lines = [CRASH, '  File "scheduler.py", line 1, in run_scheduler_process']
        if mode == "specific":
            lines.append(SPECIFIC)
        # Stamped (atomically) just before the write: a supervisor may kill us right after.
        _stamp(workdir / "fatal")
        os.write(2, ("\n".join(lines) + "\n").encode())
        os.write(2, b"Sleeping 5 seconds before crash diagnostics to let GPU activity settle.\n")
        time.sleep(5)
        return 1
    _stamp(workdir / f"running-{launch}")
    print(READY, flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
