"""The least a log-reading supervisor can do: the flood bench's floor on this machine.

    floorsup.py NEEDLE CHILD [ARGS...]

Spawns CHILD in a session of its own, and for each of its pipes runs one thread that reads
(256 KiB at a time, as the guard's pumps), writes what it read to its own stdout or stderr,
and SIGTERMs the child's group when NEEDLE is in what it read (the last len(NEEDLE) - 1 bytes
of the read before are kept, so a message cut between two reads is found). No rule pack,
no lines, no traceback reading, no decision, no journal, no restart: what is left of the
reaction is the machine's (the reader's wake-up, one substring test, the child's end).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

READ = 256 * 1024


def main() -> int:
    """Supervise argv[2:] until it ends; its exit status."""
    needle = sys.argv[1].encode()
    proc = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None

    def pump(src: int, dst: int) -> None:
        tail = b""
        while data := os.read(src, READ):
            if needle in tail + data[:len(needle)] or needle in data:
                with contextlib.suppress(ProcessLookupError):  # a later match: already gone
                    os.killpg(proc.pid, signal.SIGTERM)
            tail = data[-(len(needle) - 1):] if len(needle) > 1 else b""
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view):]

    threads = [threading.Thread(target=pump, args=(pipe.fileno(), fd), daemon=True)
               for pipe, fd in ((proc.stdout, 1), (proc.stderr, 2))]
    for thread in threads:
        thread.start()
    code = proc.wait()
    for thread in threads:
        thread.join()
    return code


if __name__ == "__main__":
    sys.exit(main())
