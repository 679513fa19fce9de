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

from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK

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


# SGLang's own port check runs with DP attention only (PortArgs.init_new, server_args.py:871-
# 883 of 0.5.23), in the main process before any scheduler starts: on CPU it runs too. It
# waits SGLANG_WAIT_PORT_TIMEOUT seconds (30) per busy port; 3 here. The schedulers of a
# `--tp-size 2` start then fail on CPU for reasons of their own (SGLANG_CPU_OMP_THREADS_BIND,
# pynccl wants CUDA): what is tested is the port check and the guard's answer to it.
DP = ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2"]
FAST_WAIT = {"SGLANG_WAIT_PORT_TIMEOUT": "3"}
START_S = 200.0


def test_sglangs_own_port_check_moves_a_busy_nccl_port(sglang_python: str,
                                                      tmp_path: Path) -> None:
    """`nccl_port at P is not available`: relaunched with a free --nccl-port, past the check."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    toml = write_guard_toml(tmp_path / "guard.toml", max_failures=1)
    with held_port() as busy:
        given = sglang_args(model, port, [*DP, "--nccl-port", str(busy)])
        cmd = guard_run_cmd(sglang_python, state, given, options=["--config", str(toml)])
        with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log",
                           env=FAST_WAIT) as guard:
            guard.wait_event("child.start", START_S, count=2)
            guard.wait_exit(START_S)  # the relaunch fails later, on CPU's own limits
            fixes = guard.events("remediated")
            assert len(fixes) == 1, fixes
            fix = fixes[0]
            assert (fix.get("rule"), fix.get("flag"), fix.get("old_value")) == (
                "nccl-port-not-available", "--nccl-port", str(busy)), fix
            assert f"nccl_port at {busy} is not available in 3 seconds." in str(fix.get("line"))
            picked = str(fix.get("new_value"))
            assert picked.isdigit() and int(picked) != busy
            starts = [[str(a) for a in s["argv"]] for s in guard.events("child.start")]
            assert _nccl_port(starts[1]) == picked
            log = guard.log_path.read_text(encoding="utf-8", errors="replace")
            # The relaunch passed the check: its schedulers began their parallel init.
            assert f"nccl_port at {picked} is not available" not in log
            assert "Init parallel begin." in log.split(f"nccl_port at {busy}")[-1]
            guard.assert_tree_gone()


def _held_derived(port: int) -> socket.socket:
    """A listener on --port + 235: DP attention's detokenizer_port (0.5.23: dist_init_port is
    --port + 233, port_base + 1 the detokenizer's, server_args.py:820-845)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port + 235))
    sock.listen()
    return sock


def test_a_busy_port_sglang_derives_from_port_gives_up_naming_it(sglang_python: str,
                                                                 tmp_path: Path) -> None:
    """No flag moves detokenizer_port: one launch, a give-up that names it, --port untouched."""
    model, state = write_tiny_llama(tmp_path / "llama"), tmp_path / "state"
    for _ in range(20):  # a --port whose +235 is free to hold
        port = free_port()
        try:
            held = _held_derived(port)
            break
        except OSError:
            continue
    toml = write_guard_toml(tmp_path / "guard.toml", max_failures=3)
    with held:
        given = sglang_args(model, port, DP)
        cmd = guard_run_cmd(sglang_python, state, given, options=["--config", str(toml)])
        with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log",
                           env=FAST_WAIT) as guard:
            assert guard.wait_exit(START_S) == EXIT_GIVE_UP, guard.describe()
            assert len(guard.events("child.start")) == 1
            assert not guard.events("remediated")
            [planned] = guard.events("give_up.planned")
            assert planned.get("rule") == "derived-port-not-available", planned
            assert str(planned.get("reason", "")).startswith(
                f"detokenizer_port ({port + 235}) is busy"), planned
            guard.assert_tree_gone()
