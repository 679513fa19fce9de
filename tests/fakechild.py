"""A scripted stand-in for an SGLang server, for tests of the child shell.

    python fakechild.py '<json script>'           run the script
    python fakechild.py --guard '<json script>'   be a tiny guard: spawn the script as a Child
                                                  from the main thread, print its pid, block

A script is a JSON list of steps, each a list: [op, args...]. Streams are "stdout"/"stderr".
  ["print", stream, text]          text + "\\n" (UTF-8)
  ["hex", stream, hexbytes]        raw bytes (binary, invalid UTF-8, NUL, ANSI)
  ["random", stream, size, seed]   `size` bytes of random.Random(seed).randbytes
  ["fill", stream, size, char]     `size` copies of one ASCII char, no newline (a huge line)
  ["sleep", seconds]
  ["ignore_term"]                  SIGTERM ignored from here on
  ["wait_term"]                    block until SIGTERM arrives, then go on (SIGTERM is blocked
                                   from the start when the script has this step: no race)
  ["spawn", n, setsid]             n grandchildren that ignore SIGTERM, print "gc-ready <pid>"
                                   on the inherited stdout, and block (setsid: leave the group)
  ["pidfile", path]                write {"pid", "pgid", "sid", "children"} as JSON, atomically
  ["pause"]                        block forever
  ["kill", signum]                 signal itself
  ["close", stream]                close that pipe (the next writes to it are dropped)
  ["wait_file", path]              block until `path` exists (the test's go-ahead)
  ["exit", code]
Everything is flushed after each step. Only the standard library, so it starts fast.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
GRANDCHILD = [["ignore_term"], ["print", "stdout", "gc-ready {pid}"], ["pause"]]


def _out(stream: str) -> int:
    return {"stdout": 1, "stderr": 2}[stream]


def _write(stream: str, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(_out(stream), view) :]


def run(script: list[list[Any]]) -> int:
    """Run the steps; the exit status."""
    children: list[int] = []
    if ["wait_term"] in script:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    for step in script:
        op, args = step[0], step[1:]
        if op == "print":
            text = str(args[1]).replace("{pid}", str(os.getpid()))
            _write(args[0], text.encode() + b"\n")
        elif op == "hex":
            _write(args[0], bytes.fromhex(str(args[1])))
        elif op == "random":
            _write(args[0], random.Random(int(args[2])).randbytes(int(args[1])))  # noqa: S311
        elif op == "fill":
            size, block = int(args[1]), str(args[2]).encode() * CHUNK
            for start in range(0, size, CHUNK):
                _write(args[0], block[: min(CHUNK, size - start)])
        elif op == "sleep":
            time.sleep(float(args[0]))
        elif op == "ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif op == "wait_term":
            signal.sigwait({signal.SIGTERM})
        elif op == "spawn":
            for _ in range(int(args[0])):
                proc = subprocess.Popen(
                    [sys.executable, __file__, json.dumps(GRANDCHILD)],
                    stdin=subprocess.DEVNULL,
                    start_new_session=bool(args[1]),
                )
                children.append(proc.pid)
        elif op == "pidfile":
            info = {"pid": os.getpid(), "pgid": os.getpgrp(), "sid": os.getsid(0)}
            path = Path(args[0])
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**info, "children": children}))
            tmp.replace(path)
        elif op == "pause":
            threading.Event().wait()
        elif op == "kill":
            os.kill(os.getpid(), int(args[0]))
        elif op == "close":
            os.close(_out(args[0]))
        elif op == "wait_file":
            while not Path(args[0]).exists():
                time.sleep(0.01)
        elif op == "exit":
            return int(args[0])
        else:
            raise SystemExit(f"fakechild: unknown step {step!r}")
    return 0


def guard(script: str) -> int:
    """Spawn `script` as a Child from this (main) thread, print its pid once it runs, block."""
    from sglang_guard.supervise.events import ChildLine, Event  # noqa: PLC0415 (guard mode only)
    from sglang_guard.supervise.shell.child import Child  # noqa: PLC0415

    events: queue.Queue[Event] = queue.Queue()
    with Path(os.devnull).open("wb") as sink:
        child = Child.spawn(
            [sys.executable, __file__, script],
            gen=1,
            events=events,
            stdout_sink=sink,
            stderr_sink=sink,
        )
        while not isinstance(event := events.get(timeout=30), ChildLine):
            pass
        print(f"child {child.pid} {event.text}", flush=True)
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--guard":
        sys.exit(guard(sys.argv[2]))
    sys.exit(run(json.loads(sys.argv[1])))
