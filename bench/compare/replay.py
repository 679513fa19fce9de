"""The pass-through child: wait at a gate, stamp the start, copy a log file to stdout.

    replay.py INPUT GATE STAMP [--per-line]

64 KiB per write; `--per-line`: one write per line, as a logging handler writes its records
(bench/per_line_writes.py).

GATE is a FIFO: opening it blocks until the bench opens its other end, so every supervisor
is started and idle (its baseline CPU read) before the first byte flows.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    src, gate, stamp = sys.argv[1:4]
    Path(gate).read_bytes()  # blocks until the bench opens and closes the FIFO's write end
    Path(stamp).write_text(repr(time.monotonic()))
    with Path(src).open("rb") as f:
        if "--per-line" in sys.argv[4:]:
            fd = sys.stdout.fileno()
            for line in f:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
        else:
            shutil.copyfileobj(f, sys.stdout.buffer, 1 << 16)
    sys.stdout.buffer.flush()
