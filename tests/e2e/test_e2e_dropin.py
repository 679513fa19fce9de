"""The drop-in (`python -m sglang_guard.launch_server`, SGLang's own arguments) on real SGLang.

Issue "Drop-in": a `--config x.yaml` naming a bad backend for the model is fixed through a
derived YAML (the user's file is never written); editing the YAML in place restarts SGLang
once, gracefully, on the new settings; an invalid edit is rejected and the server keeps
serving. Guard settings come from SGLANG_GUARD_* variables only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_guard.errors import EXIT_OK

from .guardproc import (
    GuardProc,
    guard_process,
    http_status,
    post_generate,
    sglang_args,
    write_guard_toml,
)
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

READY_S = 300.0
RELOAD_S = 30.0  # the watcher debounces for 0.3 s; the decision should follow at once
QUIET_S = 3.0  # ten debounce periods: one edit must not keep producing reload decisions


def _config_of(argv: list[str]) -> Path:
    assert "--config" in argv, f"no --config in {argv}"
    return Path(argv[argv.index("--config") + 1])


def _yaml_at(path: Path) -> dict[str, Any]:
    assert path.is_file(), f"--config points at {path}, which does not exist"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path} holds {data!r}"
    return data


def _starts(guard: GuardProc) -> list[list[str]]:
    return [[str(a) for a in r.get("argv", [])] for r in guard.events("child.start")]


def _reload_events(guard: GuardProc, since: int = 0) -> list[dict[str, Any]]:
    return [r for r in guard.events()[since:] if str(r.get("event", "")).startswith("reload")]


def _kinds(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(str(r.get("event")), str(r.get("kind"))) for r in records]


def test_dropin_fixes_yaml_reloads_on_edit_and_rejects_bad_yaml(
    sglang_python: str, tmp_path: Path
) -> None:
    """Derived YAML fix, one graceful restart per valid edit, an invalid edit rejected."""
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    user_yaml = tmp_path / "x.yaml"
    original = "attention-backend: cutedsl_mla\nmax-running-requests: 8\n"
    user_yaml.write_text(original, encoding="utf-8")
    given = sglang_args(model, port, ["--config", str(user_yaml)])
    env = {"SGLANG_GUARD_STATE_DIR": str(state), "SGLANG_GUARD_PYTHON": sglang_python,
           "SGLANG_GUARD_CONFIG": str(write_guard_toml(tmp_path / "guard.toml")),
           "SGLANG_GUARD_LOG_FORMAT": "json"}
    cmd = [sys.executable, "-m", "sglang_guard.launch_server", *given]
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log", env=env,
                       cwd=tmp_path) as guard:
        # 1. Preflight moves the bad key into a derived copy; one launch reaches ready.
        guard.wait_event("ready", READY_S)
        fixes = guard.events("remediated")
        assert [(f.get("trigger"), f.get("flag")) for f in fixes] == [
            ("preflight", "--attention-backend")], fixes
        [first] = _starts(guard)
        derived = _config_of(first)
        assert derived != user_yaml and derived.parent == state / "derived", first
        assert _yaml_at(derived) == {"max-running-requests": 8}
        assert [a for a in first if a != str(derived)] == [a for a in given
                                                           if a != str(user_yaml)]
        assert user_yaml.read_text(encoding="utf-8") == original, "the user's YAML was written"
        assert post_generate(port).get("output_ids"), guard.describe()

        # 2. A valid edit in place: one graceful restart on the new value, still fixed.
        before = len(guard.events())
        user_yaml.write_text(original.replace(": 8", ": 16"), encoding="utf-8")
        guard.wait_until("a reload decision", lambda: bool(_reload_events(guard, before)),
                         RELOAD_S)
        decision = _reload_events(guard, before)[0]
        assert (decision.get("event"), decision.get("kind")) == ("reload.applied",
                                                                 "sglang_yaml"), decision
        guard.wait_event("ready", READY_S, count=2)
        # One write of one file: one decision. (Reading the files while reloading is no edit.)
        assert _kinds(_reload_events(guard, before)) == [("reload.applied", "sglang_yaml")], (
            f"one edit, many reload decisions: {_kinds(_reload_events(guard, before))[:8]}...")
        assert len(guard.events("remediated")) <= 2, "preflight re-ran without an edit"
        starts = _starts(guard)
        assert len(starts) == 2, f"expected exactly one restart: {starts}"
        assert _yaml_at(_config_of(starts[1])) == {"max-running-requests": 16}
        after = guard.events()[before:]
        assert not [r for r in after if r.get("event") in ("backoff", "crash.detected",
                                                            "give_up")], after
        exits = [r for r in after if r.get("event") == "child.exit"]
        assert [r.get("gen") for r in exits] == [1], f"the old server did not stop once: {exits}"
        assert post_generate(port).get("output_ids"), guard.describe()

        # 3. An invalid edit: rejected, the running server untouched and serving.
        before = len(guard.events())
        user_yaml.write_text("max-running-requests: [16\n", encoding="utf-8")
        guard.wait_until("reload.rejected", lambda: bool(guard.events("reload.rejected")),
                         RELOAD_S)
        guard.never("more reload decisions after one invalid edit",
                    lambda: len(_reload_events(guard, before)) > 1, QUIET_S)
        assert http_status(port) == 200
        assert post_generate(port).get("output_ids"), guard.describe()
        assert len(_starts(guard)) == 2, f"an invalid YAML restarted SGLang: {_starts(guard)}"

        code = guard.terminate()
        assert code == EXIT_OK, f"drop-in exited {code} after SIGTERM; {guard.describe()}"
        guard.assert_tree_gone()


def test_reading_a_watched_file_is_no_change(tmp_path: Path) -> None:
    """The watcher reports writes, not reads: a reload reads every watched file (no SGLang)."""
    import queue  # noqa: PLC0415 - only this fast, SGLang-free check needs it

    from sglang_guard.supervise.events import Event, FileChanged  # noqa: PLC0415
    from sglang_guard.supervise.shell.watch import FileWatcher  # noqa: PLC0415

    watched = tmp_path / "x.yaml"
    watched.write_text("max-running-requests: 8\n", encoding="utf-8")
    events: queue.Queue[Event] = queue.Queue()
    watcher = FileWatcher(events, {str(watched): "sglang_yaml"}, debounce=0.05)
    watcher.start()
    try:
        # start() arms inotify before it returns (watchdog runs on_thread_start in the caller)
        watched.read_text(encoding="utf-8")
        with pytest.raises(queue.Empty):
            got = events.get(timeout=1.0)
            pytest.fail(f"a read of {watched.name} was reported as a change: {got}")
        watched.write_text("max-running-requests: 16\n", encoding="utf-8")
        assert events.get(timeout=5.0) == FileChanged(str(watched), "sglang_yaml")
    finally:
        watcher.stop()


@pytest.mark.e2e
def test_help_is_sglangs_own_plus_the_guard(sglang_python: str) -> None:
    """`--help` shows SGLang's real help (from the installed SGLang) and a line about the guard."""
    from sglang_guard.entry import GUARD_LINE  # noqa: PLC0415

    out = subprocess.run([sys.executable, "-m", "sglang_guard.launch_server", "--help"],
                         capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "SGLANG_GUARD_PYTHON": sglang_python})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--attention-backend" in out.stdout and "--model-path" in out.stdout
    assert out.stdout.rstrip().endswith(GUARD_LINE.strip())
