"""Start one real SGLang server on CPU, talk to it, and always tear its process group down.

    with sglang_server(python, write_tiny_llama(tmp / "llama"), log_path=tmp / "s.log") as srv:
        srv.wait_ready(timeout=240)
        assert srv.generate([1, 2, 3])["output_ids"]

A server takes ~3 GiB and ~50 s to get ready on 2 cores: run one at a time. The server runs in
its own session (process group); leaving the `with` block TERMs the group, KILLs what is left
after a grace period, and fails loudly if any process of the group survives.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

READY_LINE = "The server is fired up and ready to roll!"
# Flags that make a tiny model fit on this machine (see /work/shared/sglang-cpu-testbed.md):
# no tokenizer on disk, random weights, and a KV cache of 4096 tokens instead of ~15 GB.
CPU_FLAGS = ("--device", "cpu", "--load-format", "dummy", "--skip-tokenizer-init",
             "--max-total-tokens", "4096", "--host", "127.0.0.1")
_EOF = None


def free_port() -> int:
    """A loopback port that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_argv(python: str, model_dir: Path | str, port: int,
                extra: Sequence[str] = ()) -> list[str]:
    """The launch_server command line for a tiny model on CPU."""
    return [python, "-m", "sglang.launch_server", "--model-path", str(model_dir), *CPU_FLAGS,
            "--port", str(port), *extra]


class Server:
    """A running server: its process, port and log (every line also goes to `log_path`)."""

    def __init__(self, argv: list[str], port: int, log_path: Path) -> None:
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._log = log_path.open("w", encoding="utf-8")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Own session: one pgid for the whole tree, and our Ctrl-C does not reach it.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     text=True, errors="replace", env=env)
        self.pgid = self.proc.pid
        self._reader = threading.Thread(target=self._pump, name=f"sglang-log-{port}",
                                         daemon=True)
        self._reader.start()

    @property
    def url(self) -> str:
        """Base URL of the HTTP server."""
        return f"http://127.0.0.1:{self.port}"

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self.lines.put(line.rstrip("\n"))
        self.lines.put(_EOF)

    def wait_for_line(self, needle: str, timeout: float) -> str:
        """Wait for a log line containing `needle`; AssertionError on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needle!r} within {timeout:.0f} s; log: {self.log_path}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is _EOF:
                raise AssertionError(f"server exited ({self.proc.wait()}) before {needle!r}; "
                                     f"log: {self.log_path}")
            if needle in line:
                return line

    def health(self) -> int:
        """HTTP status of GET /health (0 when nothing answers)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    def wait_ready(self, timeout: float = 240) -> None:
        """The ready line, then GET /health answering 200."""
        start = time.monotonic()
        self.wait_for_line(READY_LINE, timeout)
        tick = threading.Event()  # never set: a poll interval that is not a bare sleep
        while (status := self.health()) != 200:
            if self.proc.poll() is not None or time.monotonic() - start > timeout:
                raise AssertionError(f"/health answered {status}; log: {self.log_path}")
            tick.wait(0.5)

    def generate(self, input_ids: Sequence[int], max_new_tokens: int = 4) -> dict[str, Any]:
        """POST /generate with token ids (no tokenizer on these servers); the JSON answer."""
        body = json.dumps({"input_ids": list(input_ids),
                           "sampling_params": {"max_new_tokens": max_new_tokens}}).encode()
        req = urllib.request.Request(f"{self.url}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        return answer

    def stop(self, grace: float = 30) -> int | None:
        """TERM the group, KILL it after `grace` s; assert nothing of it survives."""
        group = pgid_members(self.pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        # Children may outlive the main process for a moment; wait for them, by pid.
        _, alive = psutil.wait_procs([*group, *pgid_members(self.pgid)], timeout=10)
        self._reader.join(timeout=10)
        self._log.close()
        if alive:
            raise AssertionError(f"processes of server group {self.pgid} survived: "
                                 f"{[p.pid for p in alive]}")
        return self.proc.returncode


def pgid_members(pgid: int) -> list[psutil.Process]:
    """Live, non-zombie processes of process group `pgid`."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


@contextlib.contextmanager
def sglang_server(python: str, model_dir: Path | str, *, log_path: Path,
                  extra_args: Sequence[str] = (), port: int | None = None) -> Iterator[Server]:
    """A started (not yet ready) server; stopped, group and all, when the block ends."""
    port = port or free_port()
    server = Server(server_argv(python, model_dir, port, extra_args), port, log_path)
    try:
        yield server
    finally:
        server.stop()
