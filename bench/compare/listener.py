"""A supervisord PROCESS_LOG event listener that restarts a program when its log matches.

    listener.py PROGRAM REGEX      (run by supervisord, under the peers' interpreter)

The closest supervisord comes to a log-driven restart: it cannot change the command line,
so the bench's child decides by its launch count what the "corrected" launch does.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from supervisor import childutils  # type: ignore[import-not-found]


def main() -> None:
    """Serve events forever: READY, read one, act, RESULT."""
    program, pattern = sys.argv[1], re.compile(sys.argv[2])
    rpc: Any = childutils.getRPCInterface(__import__("os").environ)
    while True:
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        header = dict(x.split(":", 1) for x in sys.stdin.readline().split())
        payload = sys.stdin.read(int(header["len"]))
        head, _, data = payload.partition("\n")
        fields = dict(x.split(":", 1) for x in head.split())
        if fields.get("processname") == program and pattern.search(data):
            try:
                rpc.supervisor.stopProcess(program, True)
            except Exception as exc:  # already stopped (it exited): start it anyway
                sys.stderr.write(f"stop: {exc}\n")
            rpc.supervisor.startProcess(program, False)
        sys.stdout.write("RESULT 2\nOK")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
