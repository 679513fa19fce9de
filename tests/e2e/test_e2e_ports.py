"""A busy --nccl-port on real SGLang (0.5.23 and 0.5.18) on CPU: the guard relaunches on a
free one.

Seen by hand first (2026-12-01): with `--nccl-port P` while another process listens on
127.0.0.1:P, SGLang 0.5.23's scheduler dies in "Init parallel" with torch's
`torch.distributed.DistNetworkError: The server socket has failed to listen on any local
network address. port: P, useIpv6: false, code: -98, name: EADDRINUSE, message: address
already in use` (torch 2.14.1's TCPStore; the store's address is
srt/distributed/bootstrap.py:246), and the main process kills its tree (137) about 30 s in.
0.5.18 fails the same way (its store's address: srt/distributed/bootstrap.py:182).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_OK

from .conftest import python_for
from .guardproc import guard_process, guard_run_cmd, post_generate, sglang_args, write_guard_toml
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0  # a failed launch (~30 s) and a good one (~50 s) on 2 cores, with margin
TCPSTORE = "The server socket has failed to listen on any local network address. port: {port},"


@contextmanager
def held_port() -> Iterator[int]:
    """A port another process listens on (loopback only), for as long as the test runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _nccl_port(argv: list[str]) -> str:
    assert "--nccl-port" in argv, argv
    return argv[argv.index("--nccl-port") + 1]


# 0.5.18 needs its prefill CUDA graph off on CPU (test_e2e_old_release): given here, so that
# the busy port is the only failure.
RELEASE_FLAGS = {"0.5.23": [], "0.5.18": ["--cuda-graph-backend-prefill", "disabled"]}


@pytest.mark.parametrize("release", sorted(RELEASE_FLAGS))
def test_busy_nccl_port_is_moved_to_a_free_one_and_serves(release: str, tmp_path: Path) -> None:
    """SGLang dies on the busy --nccl-port; the guard picks a free one, relaunches, serves."""
    python = python_for(release)
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    toml = write_guard_toml(tmp_path / "guard.toml")
    with held_port() as busy:
        given = sglang_args(model, port, [*RELEASE_FLAGS[release], "--nccl-port", str(busy)])
        cmd = guard_run_cmd(python, state, given, options=["--config", str(toml)])
        with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
            guard.wait_event("ready", READY_S)

            fixes = guard.events("remediated")
            assert len(fixes) == 1, f"expected one remediation, got {fixes}"
            fix = fixes[0]
            assert (fix.get("trigger"), fix.get("rule"), fix.get("flag")) == (
                "log", "nccl-port-in-use", "--nccl-port"), fix
            assert TCPSTORE.format(port=busy) in str(fix.get("line")), fix.get("line")
            assert "EADDRINUSE" in str(fix.get("line"))
            assert fix.get("old_value") == str(busy) and fix.get("busy_port") == busy, fix
            picked = str(fix.get("new_value"))
            assert picked.isdigit() and int(picked) != busy and int(picked) != port, fix

            starts = [[str(a) for a in s["argv"]] for s in guard.events("child.start")]
            assert len(starts) == 2, f"the failed launch and one relaunch: {starts}"
            assert starts[0] == given
            assert _nccl_port(starts[1]) == picked
            # Nothing else changed: the HTTP --port clients use is the same.
            assert [a for a in starts[1] if a != picked] == [a for a in given if a != str(busy)]
            assert guard.events("ready")[0].get("gen") == 2
            assert not guard.events("give_up") and not guard.events("backoff")

            answer = post_generate(port)
            assert answer.get("output_ids"), f"/generate answered {answer}; {guard.describe()}"
            assert guard.terminate() == EXIT_OK, guard.describe()
            guard.assert_tree_gone()
