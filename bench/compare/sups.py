"""How each supervisor is started in the bench: the guard, supervisord, circusd.

Every supervisor gets a fresh directory, runs in the foreground as the bench's child, and
writes the supervised child's stdout to `<dir>/out.log` (the guard to its own stdout, which
is that file). The peers run from the throwaway venv `peers.ensure` built; their configs are
the templates beside this file, filled in with `str.format`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from measure import HERE, free_port


@dataclass(frozen=True)
class Peers:
    """The peers' interpreter (supervisor and circus are installed for it)."""

    python: Path

    @property
    def bin(self) -> Path:
        """The venv's bin directory."""
        return self.python.parent


def _spawn(cmd: Sequence[str], workdir: Path, stdout: Path | None = None) -> subprocess.Popen[bytes]:
    out = (stdout or workdir / "supervisor.out").open("wb")
    err = (workdir / "supervisor.err").open("wb")
    with out, err:
        return subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                cwd=workdir)


def start_guard(workdir: Path, child: Sequence[str], *, sglang_args: Sequence[str] = (),
                restart: dict[str, Any] | None = None, status: bool = True
                ) -> subprocess.Popen[bytes]:
    """`sglang-guard run` with the full default rule pack and the child as `[sglang] launch`.

    Readiness comes from SGLang's ready line ([health] enabled = false): the bench's children
    serve no HTTP. The child's stdout is the guard's stdout: `<workdir>/out.log`. The status
    port is on (as by default) on a free port, or off (`status=False`).
    """
    listen = f"127.0.0.1:{free_port()}" if status else "off"
    lines = ["[sglang]", f"launch = {json.dumps(list(child))}", "[restart]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in (restart or {}).items()]
    lines += ["[health]", "enabled = false", "[gpu]", 'sm = "none"',
              "[status]", f"listen = {json.dumps(listen)}"]
    # The config has a directory of its own, as in a deployment (/etc/sglang-guard): the
    # guard watches its config's directory (an editor's rename-over must be seen), and the
    # bench children write their stamps and the output log into `workdir`; beside the
    # config each stamp woke the watcher's threads at the very moment a reaction is timed
    # (measured: ~0.5-1 ms of the idle figure).
    (workdir / "etc").mkdir(exist_ok=True)
    cfg = workdir / "etc" / "guard.toml"
    cfg.write_text("\n".join(lines) + "\n")
    port = 1  # nothing listens there; the children never bind it
    cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(cfg),
           "--state-dir", str(workdir / "state"), "--no-preflight", "--log-format", "json",
           "--", "--model-path", "/models/bench", "--port", str(port), *sglang_args]
    return _spawn(cmd, workdir, stdout=workdir / "out.log")


def start_floor(workdir: Path, child: Sequence[str], needle: str) -> subprocess.Popen[bytes]:
    """floorsup.py (the flood bench's floor), writing the child's stdout to `<dir>/out.log`."""
    return _spawn([sys.executable, str(HERE / "floorsup.py"), needle, *child], workdir,
                  stdout=workdir / "out.log")


def start_supervisord(workdir: Path, peers: Peers, child: Sequence[str], *, autorestart: str,
                      startsecs: int = 1, startretries: int = 3, grace: float = 10.0,
                      listener_regex: str | None = None) -> subprocess.Popen[bytes]:
    """supervisord (nodaemon) with one program; optionally the PROCESS_LOG fixer listener."""
    listener = ""
    if listener_regex is not None:
        cmd = shlex.join([str(peers.python), str(HERE / "listener.py"), "sglang", listener_regex])
        listener = (f"[eventlistener:fixer]\ncommand={cmd}\nevents=PROCESS_LOG\n"
                    "buffer_size=10000\nstderr_logfile={workdir}/listener.err\n")
    text = (HERE / "supervisord.conf").read_text().format(
        workdir=workdir, command=shlex.join(list(child)), autorestart=autorestart,
        startsecs=startsecs, startretries=startretries, grace=max(1, round(grace)),
        events="true" if listener_regex else "false", listener=listener.format(workdir=workdir))
    conf = workdir / "supervisord.conf"
    conf.write_text(text)
    return _spawn([str(peers.bin / "supervisord"), "-c", str(conf)], workdir)


def start_circus(workdir: Path, peers: Peers, child: Sequence[str], *, respawn: bool,
                 max_retry: int = 5, grace: float = 30.0) -> subprocess.Popen[bytes]:
    """circusd with one watcher, its streams written by FileStream."""
    text = (HERE / "circus.ini").read_text().format(
        workdir=workdir, command=shlex.join(list(child)), grace=grace,
        respawn="true" if respawn else "false", max_retry=max_retry)
    conf = workdir / "circus.ini"
    conf.write_text(text)
    return _spawn([str(peers.bin / "circusd"), str(conf)], workdir)
