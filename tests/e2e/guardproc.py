"""Run the real guard (`sglang-guard run` or the drop-in) as a process, and always clean up.

    with guard_process(cmd, state_dir=d, log_path=tmp / "guard.log") as g:
        g.wait_event("ready", timeout=300)
        assert generate(port)["output_ids"]
        assert g.terminate() == 0
        g.assert_tree_gone()

The guard runs in its own session; SGLang runs in another one the guard creates (its pgid is
in `<state-dir>/child.pgid`). Every wait is a bounded poll of the journal or of a process,
paced by an Event that is never set (no bare sleeps); leaving the `with` block kills, by
process group, whatever is left of both sessions.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from sglang_guard.supervise.shell.journal import read_journal

from .server import CPU_FLAGS, pgid_members

POLL_S = 0.25
Record = dict[str, Any]


def sglang_args(model_dir: Path | str, port: int, extra: Sequence[str] = ()) -> list[str]:
    """SGLang's own arguments (no launcher prefix) for a tiny model on CPU."""
    return ["--model-path", str(model_dir), *CPU_FLAGS, "--port", str(port), *extra]


def guard_run_cmd(python: str, state_dir: Path, args: Sequence[str], *,
                  options: Sequence[str] = ()) -> list[str]:
    """`python -m sglang_guard run --python PY --state-dir D [options] -- ARGS`."""
    return [sys.executable, "-m", "sglang_guard", "run", "--python", python,
            "--state-dir", str(state_dir), "--log-format", "json", *options, "--", *args]


def write_guard_toml(path: Path, **restart: float) -> Path:
    """A guard config with the given `[restart]` keys and slow liveness probes."""
    lines = ["[restart]", *(f"{k} = {json.dumps(v)}" for k, v in restart.items()),
             # a 4-token /health_generate every 30 s would compete for 2 cores with the test
             "[health]", "liveness_interval_s = 600.0"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def post_generate(port: int, input_ids: Sequence[int] = (1, 2, 3),
                  max_new_tokens: int = 4) -> dict[str, Any]:
    """POST /generate with token ids; the JSON answer (raises on HTTP errors)."""
    body = json.dumps({"input_ids": list(input_ids),
                       "sampling_params": {"max_new_tokens": max_new_tokens}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def http_status(port: int, path: str = "/health") -> int:
    """HTTP status of GET `path` (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


DYING_GRACE_S = 45.0  # how much longer a process with SIGKILL pending may take to go
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # in /proc/<pid>/status signal masks


def kernel_view(pid: int) -> dict[str, Any]:
    """What /proc says of a process: its state, parent, pending signals (shared and of each
    thread, or-ed into `pending`), and the state and wait channel of each thread."""
    view: dict[str, Any] = {"pending": 0}
    base = Path(f"/proc/{pid}")
    with contextlib.suppress(OSError, ValueError):
        for line in (base / "status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("State", "PPid", "Threads", "SigBlk", "SigIgn", "SigCgt"):
                view[key] = value.strip()
            elif key in ("SigPnd", "ShdPnd"):
                view[key] = value.strip()
                view["pending"] |= int(value, 16)
    threads = []
    with contextlib.suppress(OSError):
        for task in sorted((base / "task").iterdir()):
            with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
                state = (task / "stat").read_text().rpartition(")")[2].split()[0]
                wchan = (task / "wchan").read_text().strip()
                pending = next(int(line.split()[1], 16) for line in
                               (task / "status").read_text().splitlines()
                               if line.startswith("SigPnd:"))
                view["pending"] |= pending
                threads.append(f"{task.name}:{state}:{wchan or '-'}")
    view["threads"] = threads
    return view


def alive(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` still running (same pid and start time, not a zombie)."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


class GuardProc:
    """A running guard: its process, state dir and log; tracks every pid of its tree seen."""

    def __init__(self, cmd: Sequence[str], state_dir: Path, log_path: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.cmd = list(cmd)
        self.state_dir = state_dir
        self.journal_path = state_dir / "journal.jsonl"
        self.log_path = log_path
        self._log = log_path.open("wb")
        # The status port on a free port of its own (a test's `env` may name one): the
        # default 9488 may be another guard's on this host (tests/support/fixtures.py).
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "SGLANG_GUARD_STATUS_LISTEN": "127.0.0.1:0", **(env or {})}
        # Own session: the test's Ctrl-C does not reach it and its pgid is its pid.
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env=full_env, cwd=cwd)
        self.pgid = self.proc.pid
        self.seen: dict[int, psutil.Process] = {}
        self.child_pgids: set[int] = set()
        self._tick = threading.Event()  # never set: the poll interval, not a bare sleep

    # -- observation -----------------------------------------------------------------------

    def events(self, name: str | None = None) -> list[Record]:
        """Journal records so far (of one event name, when given)."""
        records = list(read_journal(self.journal_path))
        return [r for r in records if name is None or r.get("event") == name]

    def observe(self) -> list[psutil.Process]:
        """Remember the guard's current descendants and SGLang's pgid; the live tree."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            record = json.loads((self.state_dir / "child.pgid").read_text())
            self.child_pgids.add(int(record["pgid"]))
        tree: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        for pgid in self.child_pgids:
            tree += pgid_members(pgid)
        for p in tree:
            self.seen.setdefault(p.pid, p)
        return tree

    def wait_until(self, what: str, cond: Callable[[], bool], timeout: float, *,
                   allow_exit: bool = False) -> None:
        """Poll `cond` until true; AssertionError on timeout or (unless allowed) guard exit."""
        deadline = time.monotonic() + timeout
        while True:
            self.observe()
            if cond():
                return
            if not allow_exit and self.proc.poll() is not None:
                raise AssertionError(f"guard exited ({self.proc.returncode}) before {what}; "
                                     f"{self.describe()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout:.0f} s; {self.describe()}")
            self._tick.wait(POLL_S)

    def never(self, what: str, cond: Callable[[], bool], seconds: float) -> None:
        """Watch for `seconds` that `cond` stays false (a storm detector, not a sync point)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if cond():
                raise AssertionError(f"{what} within {seconds:.0f} s; {self.describe()}")
            self._tick.wait(POLL_S)

    def wait_event(self, name: str, timeout: float, *, count: int = 1,
                   allow_exit: bool = False) -> Record:
        """Wait until the journal holds `count` events `name`; the last of them."""
        self.wait_until(f"{count}x journal event {name!r}",
                        lambda: len(self.events(name)) >= count, timeout, allow_exit=allow_exit)
        return self.events(name)[count - 1]

    def wait_exit(self, timeout: float) -> int:
        """The guard's exit status (AssertionError when it is still running at the deadline)."""
        self.wait_until("guard exit", lambda: self.proc.poll() is not None, timeout,
                        allow_exit=True)
        return int(self.proc.returncode)

    def describe(self) -> str:
        """Journal event names and the log's tail, for failure messages."""
        names = [str(r.get("event")) for r in self.events()]
        tail = b""
        with contextlib.suppress(OSError):
            tail = self.log_path.read_bytes()[-3000:]
        return (f"journal: {names}; log {self.log_path} ends:\n"
                f"{tail.decode('utf-8', 'replace')}")

    def story(self, limit: int = 60) -> str:
        """What happened, for a failure message: each journal event with the fields that say
        why, then the log's error-shaped lines (a traceback's banner and exception lines),
        so that a CI log alone tells which line decided what."""
        keys = ("gen", "stage", "rule", "trigger", "flag", "reason", "code", "returncode", "line")
        events = [" ".join([str(r.get("event"))] + [f"{k}={str(r[k])[:160]!r}" for k in keys
                                                   if k in r])
                  for r in self.events()]
        shaped = re.compile(rb"^(?:\S*(?:Error|Exception)\b|.*(?:Traceback|hit an exception))")
        lines: list[str] = []
        with contextlib.suppress(OSError):
            lines = [ln[:200].decode("utf-8", "replace")
                     for ln in self.log_path.read_bytes().splitlines()
                     if shaped.match(ln) and not ln.startswith(b"{")]  # not the guard's own
        return "\njournal:\n  " + "\n  ".join(events[-limit:]) + \
            "\nerror-shaped log lines:\n  " + "\n  ".join(lines[-limit:])

    # -- ending ----------------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        """Send `signum` to the guard's main process only (as systemd's KillMode=mixed does)."""
        self.observe()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signum)

    def terminate(self, timeout: float = 90) -> int:
        """SIGTERM to the guard; its exit status."""
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def leftovers(self, timeout: float) -> list[psutil.Process]:
        """Processes of the tree seen so far still alive after up to `timeout` s."""
        procs = [*self.seen.values()]
        for pgid in self.child_pgids:
            procs += pgid_members(pgid)
        _, left = psutil.wait_procs(alive(procs), timeout=timeout)
        return alive(left)

    def assert_tree_gone(self, timeout: float = 15) -> None:
        """Every process of the tree ever seen is gone within `timeout` s.

        One that is still there but has SIGKILL pending was killed and is being torn down by
        the kernel (a loaded host can take a while to free a large process): it may take
        `DYING_GRACE_S` more, and the test warns with the kernel's view of it. One with no
        SIGKILL pending was never killed: the test fails at once, with that view.
        """
        left = self.leftovers(timeout)
        if not left:
            return
        views = {p.pid: kernel_view(p.pid) for p in left}
        dying = all(SIGKILL_BIT & view.get("pending", 0) for view in views.values())
        later = self.leftovers(DYING_GRACE_S) if dying else left
        names = []
        for p in later or left:
            with contextlib.suppress(psutil.Error):
                names.append(f"{p.pid}:{p.name()}")
        if later:
            raise AssertionError(f"processes of the guard's tree survived: {names}; kernel's "
                                 f"view after {timeout} s: {views}; {self.describe()}")
        warnings.warn(f"{names} went only after more than {timeout} s, with SIGKILL pending "
                      f"(the kernel's view then: {views})", stacklevel=2)

    def cleanup(self) -> None:
        """Kill, by process group and pid, whatever is left; close the log."""
        self.observe()
        for pgid in (self.pgid, *self.child_pgids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for p in alive(list(self.seen.values())):
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        psutil.wait_procs(alive(list(self.seen.values())), timeout=15)
        self._log.close()


@contextlib.contextmanager
def guard_process(cmd: Sequence[str], *, state_dir: Path, log_path: Path,
                  env: Mapping[str, str] | None = None,
                  cwd: Path | None = None) -> Iterator[GuardProc]:
    """A started guard; killed, both sessions and all, when the block ends."""
    guard = GuardProc(cmd, state_dir, log_path, env=env, cwd=cwd)
    try:
        yield guard
    finally:
        guard.cleanup()
