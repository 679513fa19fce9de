"""Hostile output: 10 MB lines (100 MB in CI, 1 GB as a soak), invalid UTF-8 and NUL bytes.

What must hold: every byte the child wrote comes out of the guard's stdout, in order (size
and SHA-256); a fatal line after the flood, or with garbage around it on the same line, is
still matched and fixed; the guard's memory stays bounded (a line is matched by its head).
"""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_guard.errors import EXIT_OK
from sglang_guard.supervise.machine import READY_LINE
from support.guards import GuardRun, argv_for, guard_toml, leftovers, sha_of
from support.harness import HealthServer, Launcher, count, journal_events, ready_then_wait, wait_for
from support.pack import FA3_LINE

LINE = 10 * 1024 * 1024
RSS_LIMIT_MB = 400  # the guard idles at ~45 MB; a line is matched by its 64 KiB head


def _flood(tmp_path: Path, pack: Path, start_guard: type[GuardRun], lines: int) -> None:
    chars = "abcdefghij"
    script: list[list[Any]] = []
    for i in range(lines):
        script += [["fill", "stdout", LINE, chars[i % 10]], ["hex", "stdout", "0a"]]
    script += [["print", "stdout", FA3_LINE], ["wait_term"], ["exit", 0]]
    launcher = Launcher(tmp_path, [script, ready_then_wait()])
    state = tmp_path / "state"
    peak = 0.0
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=2, stop_grace_s=0.5)
        run = start_guard(tmp_path, config, argv_for(server.port, "--attention-backend", "fa3"),
                          state)
        guard = psutil.Process(run.proc.pid)

        def fixed_and_ready() -> bool:
            nonlocal peak
            peak = max(peak, guard.memory_info().rss / 2**20)
            return count(state, "ready") >= 1

        wait_for(fixed_and_ready, timeout=60 + lines, what="the fixed launch ready")
        run.proc.send_signal(signal.SIGTERM)
        code, _, err = run.wait(60)
    assert code == EXIT_OK, err
    parts = []
    for i in range(lines):
        parts += [(chars[i % 10].encode() * (1 << 20), LINE >> 20), (b"\n", 1)]
    parts += [(FA3_LINE.encode() + b"\n", 1), (READY_LINE.encode() + b"\n", 1)]
    assert (run.stdout_path.stat().st_size, _sha_file(run.stdout_path)) == sha_of(*parts)
    assert [r["rule"] for r in journal_events(state) if r["event"] == "remediated"] == ["fa3-sm"]
    assert peak < RSS_LIMIT_MB, f"guard RSS peaked at {peak:.0f} MB"
    assert leftovers(launcher) == []


def _sha_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def test_100_mb_of_10_mb_lines_pass_through_whole(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    _flood(tmp_path, pack, start_guard, 10)


@pytest.mark.soak
def test_1_gb_of_10_mb_lines_pass_through_whole(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    _flood(tmp_path, pack, start_guard, 100)


def test_invalid_utf8_and_nul_bytes_pass_through_and_matching_goes_on(
        tmp_path: Path, pack: Path, start_guard: type[GuardRun]) -> None:
    garbage = [
        "fffe00c328a0a1e282",  # invalid UTF-8 and a NUL, no newline yet
        "0a",
        "000000000a",  # a line of NULs
        "1b5b33316d7265641b5b306d0d0a",  # ANSI colours and a CR LF
        "c0afedbfbf0a",  # overlong and surrogate encodings
    ]
    # NUL and ANSI in front (stripped: the line still starts with the exception class),
    # invalid UTF-8 and NUL behind. (Invalid bytes in front would make it no exception line:
    # a rule reads SGLang's own error output only, issue 12.)
    # The traceback it ends comes first: only such a line is read as one (rules/tracebacks.py).
    frames = ("Traceback (most recent call last):\n"
              '  File "attention_registry.py", line 244, in create_flashattention_v3_backend\n')
    fatal = frames.encode().hex() + "001b5b306d" + FA3_LINE.encode().hex() + "00ff0a"
    script = [["hex", "stdout", h] for h in [*garbage, fatal]]
    launcher = Launcher(tmp_path, [[*script, ["wait_term"], ["exit", 0]], ready_then_wait()])
    state = tmp_path / "state"
    with HealthServer() as server:
        config = guard_toml(tmp_path, launcher, pack, max_failures=2, stop_grace_s=0.5)
        run = start_guard(tmp_path, config, argv_for(server.port, "--attention-backend", "fa3"),
                          state)
        wait_for(lambda: count(state, "ready") >= 1, what="the fixed launch ready")
        run.proc.send_signal(signal.SIGTERM)
        code, out, err = run.wait(30)
    assert code == EXIT_OK, err
    assert out == bytes.fromhex("".join([*garbage, fatal])) + READY_LINE.encode() + b"\n"
    assert "fa3" not in launcher.argvs()[1]
    assert leftovers(launcher) == []
