"""A simulated multi-node group: one real `sglang-guard run` process per node on loopback.

Each node has its own directory (its cwd: `--model-path model` is that node's own model
directory), its own guard config, state dir and launcher (the fake SGLang of
support/harness.py, which records every launch's argv). The guards talk real HTTP on the
leader's group port, a free one per group. Every wait is a bounded poll on a journal, a file
or a process, never a bare sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sglang_guard.supervise.machine import READY_LINE

from .harness import HEALTH_HOST, HealthServer, Launcher, journal_events, wait_for
from .procs import free_port

# SGLang's capture wrapper around torch's OOM, as 0.5.23 prints it
# (tests/data/sglang-messages-0.5.23.toml); its advice names --mem-fraction-static. torch's
# bare line is advice only since issue 20 (configs/rules/default.toml).
OOM_LINE = ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.")


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}


def leader_plan() -> list[list[Any]]:
    """Rank 0: says it is ready (its /health is the test's server), runs until SIGTERM."""
    return [["print", "stdout", READY_LINE], ["wait_term"], ["exit", 0]]


def worker_plan(*before: list[Any]) -> list[list[Any]]:
    """Rank >= 1: no ready line, no HTTP server of its own; runs until SIGTERM."""
    return [*before, ["wait_term"], ["exit", 0]]


@dataclass
class Node:
    """One simulated node: its guard process and where it keeps things."""

    rank: int
    root: Path
    launcher: Launcher
    proc: subprocess.Popen[bytes] | None = None
    pidfile: Path = field(init=False)

    def __post_init__(self) -> None:
        self.pidfile = self.root / "child.pid"

    @property
    def state(self) -> Path:
        """The node's state dir."""
        return self.root / "state"

    def journal(self) -> list[dict[str, Any]]:
        """Every record of the node's journal so far."""
        path = self.state / "journal.jsonl"
        return journal_events(self.state) if path.exists() else []

    def events(self, name: str) -> list[dict[str, Any]]:
        """The node's journal records of one event."""
        return [r for r in self.journal() if r.get("event") == name]

    def wait_event(self, name: str, times: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
        """Wait until the journal holds `name` `times` times; those records."""
        try:
            return list(wait_for(
                lambda: (hits := self.events(name)) and len(hits) >= times and hits,
                timeout=timeout, what=f"{times} x {name} on node {self.rank}"))
        except AssertionError as exc:  # say what the node did instead
            seen = [(r.get("event"), r.get("gen"), r.get("reason")) for r in self.journal()]
            raise AssertionError(f"{exc}; node {self.rank}'s journal: {seen}") from None

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Wait for the guard; its status and stderr."""
        assert self.proc is not None
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err.decode(errors="replace")


class Group:
    """Builds the nodes of one group and starts their guards."""

    def __init__(self, tmp: Path, nnodes: int, health: HealthServer) -> None:
        self.tmp = tmp
        self.nnodes = nnodes
        self.health = health
        self.port = free_port()
        self.dist = free_port()
        self.nodes: list[Node] = []
        self.settings = {"heartbeat_s": 0.2, "leader_lost_s": 3.0, "worker_lost_s": 3.0,
                         "join_timeout_s": 20.0}
        self.secret = "group-secret-" + os.urandom(12).hex()  # every node's own copy of it

    def node(self, rank: int, plans: list[list[list[Any]]], *,
             config: dict[str, Any] | None = None) -> Node:
        """Make node `rank`: its model dir, launcher and guard config."""
        root = self.tmp / f"node{rank}"
        (root / "model").mkdir(parents=True)
        (root / "model" / "config.json").write_text(json.dumps(config or CONFIG))
        node = Node(rank, root, Launcher(root, plans))
        self._write_config(node)
        self.nodes.append(node)
        return node

    def argv(self, rank: int, *more: str, dist_init: bool = True) -> list[str]:
        """Node `rank`'s SGLang argv: the same on every node but the rank."""
        where = ["--dist-init-addr", f"127.0.0.1:{self.dist}"] if dist_init else []
        return ["--model-path", "model", "--port", str(self.health.port),
                "--nnodes", str(self.nnodes), "--node-rank", str(rank), *where,
                "--mem-fraction-static", "0.9", *more]

    def start(self, node: Node, *more: str, env: dict[str, str] | None = None,
              dist_init: bool = True) -> Node:
        """Start node's guard."""
        cmd = [sys.executable, "-m", "sglang_guard", "run", "--config",
               str(node.root / "guard.toml"), "--state-dir", str(node.state), "--no-preflight",
               "--", *self.argv(node.rank, *more, dist_init=dist_init)]
        node.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, cwd=node.root,
                                     env={**os.environ, **(env or {})})
        return node

    def _write_config(self, node: Node) -> None:
        secret = node.root / "group.secret"
        secret.write_text(self.secret + "\n")
        secret.chmod(0o600)
        lines = ["[sglang]", f"launch = {json.dumps(node.launcher.command)}",
                 "[restart]", "max_failures = 3", "backoff_initial_s = 0.05",
                 "backoff_max_s = 0.1", "stop_grace_s = 2.0",
                 "[health]", f'host = "{HEALTH_HOST}"', "timeout_s = 2.0",
                 "[group]", f"port = {self.port}", f"secret_file = {json.dumps(str(secret))}",
                 *[f"{k} = {v}" for k, v in self.settings.items()],
                 "[status]", 'listen = "off"',  # one host, several guards: no shared port
                 "[gpu]", 'sm = "none"', "[log]", 'format = "json"']
        (node.root / "guard.toml").write_text("\n".join(lines) + "\n")

    def stop_all(self) -> None:
        """Kill whatever is left: guards and every fake SGLang of this test."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.communicate(timeout=30)
        for pid in self.fake_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def fake_pids(self, node: Node | None = None) -> list[int]:
        """Live fake SGLang processes of this group (or of one node)."""
        marks = [str(n.root / "launcher.py") for n in ([node] if node else self.nodes)]
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(m in cmd for m in marks):
                found.append(proc.pid)
        return found

