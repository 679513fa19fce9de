"""`sglang-guard run` in front of real SGLang 0.5.23 on CPU: fix, restart, serve, stop.

Each test starts the real guard as a process (guardproc.py) and waits on its journal. The
fatal lines are SGLang's own: nothing here is scripted. Real servers run one at a time and
every test leaves no process behind (checked with psutil, cleaned up by pgid regardless).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK, EXIT_REFUSED

from .guardproc import (
    GuardProc,
    guard_process,
    guard_run_cmd,
    post_generate,
    sglang_args,
    write_guard_toml,
)
from .models import write_tiny_deepseek_v3, write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0  # two launches on 2 cores: ~25 s to fail, ~50 s to ready, with margin
CUTEDSL = ("--attention-backend", "cutedsl_mla")
CUTEDSL_MSG = "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"
HPC_MSG = "hpc_ops backend can only be used with non-MLA models."
FORWARD_MSG = "RuntimeError: Expected size for first two dimensions of batch2 tensor"


def _argv_of(record: dict[str, object]) -> list[str]:
    argv = record.get("argv")
    assert isinstance(argv, list), f"child.start without an argv list: {record}"
    return [str(a) for a in argv]


def _assert_serves(guard: GuardProc, port: int) -> None:
    answer = post_generate(port)
    assert answer.get("output_ids"), f"/generate answered {answer}; {guard.describe()}"


def _stop_cleanly(guard: GuardProc) -> None:
    code = guard.terminate()
    assert code == EXIT_OK, f"guard exited {code} after SIGTERM; {guard.describe()}"
    guard.assert_tree_gone()
    exits = guard.events("guard.exit")
    assert [e.get("code") for e in exits] == [EXIT_OK], f"guard.exit events: {exits}"


def test_log_path_drops_the_flag_and_serves(sglang_python: str, tmp_path: Path) -> None:
    """SGLang dies on cutedsl_mla; the guard drops it from the log line, restarts, serves."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, CUTEDSL)
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)

        fixes = guard.events("remediated")
        assert len(fixes) == 1, f"expected one remediation, got {fixes}"
        fix = fixes[0]
        assert fix.get("trigger") == "log", fix
        assert fix.get("flag") == "--attention-backend", fix
        assert fix.get("action") == "drop_flag", fix
        assert CUTEDSL_MSG in str(fix.get("line")), f"fixed on another line: {fix.get('line')}"
        assert fix.get("argv_before") == given, fix
        assert "cutedsl_mla" not in fix.get("argv_after", []), fix

        starts = guard.events("child.start")
        assert len(starts) == 2, f"expected the failed launch and one restart: {starts}"
        assert _argv_of(starts[0]) == given
        assert _argv_of(starts[1]) == [a for a in given if a not in CUTEDSL]
        assert guard.events("ready")[0].get("gen") == starts[1].get("gen")
        _assert_serves(guard, port)
        _stop_cleanly(guard)


def test_preflight_path_launches_once_then_survives_sigkill(
    sglang_python: str, tmp_path: Path
) -> None:
    """Preflight drops the flag before any launch; a SIGKILLed guard leaves no SGLang behind."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port, CUTEDSL)
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python, state, given, options=["--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        guard.wait_event("ready", READY_S)

        fixes = guard.events("remediated")
        assert len(fixes) == 1, f"expected one remediation, got {fixes}"
        assert fixes[0].get("trigger") == "preflight", fixes[0]
        assert fixes[0].get("flag") == "--attention-backend", fixes[0]
        starts = guard.events("child.start")
        assert len(starts) == 1, f"preflight must spare a failed launch: {starts}"
        assert _argv_of(starts[0]) == [a for a in given if a not in CUTEDSL]
        assert not guard.events("child.exit"), guard.describe()
        _assert_serves(guard, port)

        tree = guard.observe()
        sglang = [p for p in tree if p.pid != guard.proc.pid]
        assert len(sglang) >= 3, f"expected launch_server, scheduler, detokenizer: {sglang}"
        guard.signal(signal.SIGKILL)
        assert guard.wait_exit(30) == -signal.SIGKILL
        # Nobody reaps or TERMs them now: only the parent-death signal chain can end them.
        guard.assert_tree_gone(timeout=15)


def test_mla_path_drops_once_then_treats_the_forward_crash_as_a_crash(
    sglang_python: str, tmp_path: Path
) -> None:
    """hpc_ops on DeepSeek-V3 is dropped once; the later scheduler crash ends in give-up (75)."""
    model = write_tiny_deepseek_v3(tmp_path / "dsv3")
    port, state = free_port(), tmp_path / "state"
    given = sglang_args(model, port, ["--attention-backend", "hpc_ops"])
    toml = write_guard_toml(tmp_path / "guard.toml", max_failures=2, window_s=600.0,
                            backoff_initial_s=0.1, backoff_max_s=0.5, stop_grace_s=10.0)
    cmd = guard_run_cmd(sglang_python, state, given,
                        options=["--no-preflight", "--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        code = guard.wait_exit(420)
        story = guard.story()  # every message below says what each launch died of
        assert code == EXIT_GIVE_UP, f"guard exited {code}; {guard.describe()}{story}"
        guard.assert_tree_gone()

        fixes = guard.events("remediated")
        assert len(fixes) == 1, f"a crash must never change another flag: {fixes}{story}"
        assert fixes[0].get("trigger") == "log", f"{fixes[0]}{story}"
        assert fixes[0].get("flag") == "--attention-backend", f"{fixes[0]}{story}"
        assert HPC_MSG in str(fixes[0].get("line")), f"{fixes[0]}{story}"

        log = guard.log_path.read_text(encoding="utf-8", errors="replace")
        assert FORWARD_MSG in log, f"the launch after the fix never reached a forward pass{story}"
        crashes = guard.events("crash.detected")
        assert crashes, f"the scheduler crash was not recognised; {guard.describe()}"
        assert all(c.get("rule") == "scheduler-crash" for c in crashes), f"{crashes}{story}"
        assert guard.events("backoff"), f"no backoff before giving up; {guard.describe()}"
        assert guard.events("give_up"), guard.describe()
        starts = guard.events("child.start")
        assert len(starts) == 3, f"fail, fixed launch, one retry: {starts}{story}"
        fixed = [a for a in given if a not in ("--attention-backend", "hpc_ops")]
        assert [_argv_of(s) for s in starts[1:]] == [fixed, fixed]
        assert [e.get("code") for e in guard.events("guard.exit")] == [EXIT_GIVE_UP]


def test_policy_fail_refuses_without_launching(sglang_python: str, tmp_path: Path) -> None:
    """`--policy fail` on a bad backend exits 78 and starts nothing."""
    model, state = write_tiny_llama(tmp_path / "llama"), tmp_path / "state"
    cmd = guard_run_cmd(sglang_python, state, sglang_args(model, free_port(), CUTEDSL),
                        options=["--policy", "fail"])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        code = guard.wait_exit(60)
        assert code == EXIT_REFUSED, f"guard exited {code}; {guard.describe()}"
        assert not guard.events("child.start"), guard.describe()
        log = guard.log_path.read_text(encoding="utf-8")
        assert "cutedsl_mla" in log, "the refusal does not name the flag's value"
        assert "server_args=" not in log, "SGLang was started"


def test_good_command_passes_through_unchanged(sglang_python: str, tmp_path: Path) -> None:
    """A command line that fits reaches ready with exactly the argv given, and serves."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    given = sglang_args(model, port)
    toml = write_guard_toml(tmp_path / "guard.toml")
    cmd = guard_run_cmd(sglang_python, state, given, options=["--config", str(toml)])
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log") as guard:
        ready = guard.wait_event("ready", READY_S)
        starts = guard.events("child.start")
        assert [_argv_of(s) for s in starts] == [given]
        assert ready.get("argv") == given
        assert not guard.events("remediated"), guard.events("remediated")
        _assert_serves(guard, port)
        _stop_cleanly(guard)
