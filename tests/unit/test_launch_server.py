"""The drop-in launcher: SGLang's arguments, guard settings from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_guard.entry import GUARD_LINE, guard_config_from_env
from sglang_guard.errors import EXIT_ENVIRONMENT, EXIT_USAGE
from support.sites import site_with


def _launch(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_guard.launch_server", *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **env})


def test_help_without_sglang_says_so_and_describes_the_guard() -> None:
    out = _launch(["--help"], SGLANG_GUARD_PYTHON=sys.executable)  # no SGLang here
    assert out.returncode == 0
    assert "SGLang is not installed" in out.stdout
    assert GUARD_LINE.strip() in out.stdout


def test_bad_policy_in_the_environment_is_one_clear_line() -> None:
    out = _launch(["--model-path", "/nowhere"], SGLANG_GUARD_POLICY="sometimes")
    assert out.returncode == EXIT_USAGE
    assert out.stderr.strip().splitlines() == [
        "sglang-guard: error: SGLANG_GUARD_POLICY='sometimes': expected one of "
        "drop, rewrite, fail, warn"]


def test_missing_model_is_one_clear_line(tmp_path: Path) -> None:

    # An interpreter with an SGLang 0.5.23 on its path (without one: exit 69, issue 19).
    site = site_with(tmp_path, "0.5.23")
    out = _launch(["--model-path", str(tmp_path / "gone")], PYTHONPATH=str(site),
                  SGLANG_GUARD_STATE_DIR=str(tmp_path / "state"),
                  SGLANG_GUARD_STATUS_LISTEN="off")  # no default port
    assert out.returncode == EXIT_USAGE
    assert out.stderr.strip().splitlines()[-1].startswith("sglang-guard: error: model path")


def test_no_sglang_for_the_interpreter_is_69_at_once(tmp_path: Path) -> None:
    out = _launch(["--model-path", str(tmp_path / "gone")], SGLANG_GUARD_PYTHON=sys.executable,
                  SGLANG_GUARD_STATE_DIR=str(tmp_path / "state"), PYTHONPATH="",
                  SGLANG_GUARD_STATUS_LISTEN="off")  # no default port
    assert out.returncode == EXIT_ENVIRONMENT
    (line,) = out.stderr.strip().splitlines()
    assert f"{sys.executable} has no SGLang" in line


def test_environment_overrides_the_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "guard.toml"
    cfg.write_text('[policy]\ndefault = "warn"\n[gpu]\nsm = "90"\n')
    monkeypatch.setenv("SGLANG_GUARD_CONFIG", str(cfg))
    assert guard_config_from_env().policy.default == "warn"
    monkeypatch.setenv("SGLANG_GUARD_POLICY", "fail")
    monkeypatch.setenv("SGLANG_GUARD_GPU_SM", "100")
    monkeypatch.setenv("SGLANG_GUARD_STATE_DIR", str(tmp_path / "s"))
    got = guard_config_from_env()
    assert (got.policy.default, got.gpu_sm, got.state_dir) == ("fail", "100", str(tmp_path / "s"))


def test_default_config_places_are_searched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "xdg" / "sglang-guard" / "guard.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[policy]\ndefault = "rewrite"\n')
    monkeypatch.delenv("SGLANG_GUARD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    if Path("/etc/sglang-guard/guard.toml").exists():
        pytest.skip("a system-wide guard config exists on this machine and takes precedence")
    assert guard_config_from_env().policy.default == "rewrite"
