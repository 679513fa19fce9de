"""Issue 10's smaller mismatches, each as the user meets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.entry import guard_config_from_env
from sglang_guard.errors import EXIT_USAGE, InputError
from support.guards import guard_toml
from support.harness import Launcher, ready_then_wait
from support.models import write_llama
from support.pack import PACK_TEXT


@pytest.fixture
def config(tmp_path: Path) -> tuple[Path, Launcher]:
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    launcher = Launcher(tmp_path, [ready_then_wait()])
    return guard_toml(tmp_path, launcher, pack), launcher


def _run(tmp: Path, config: Path, *sglang: str, preflight: bool = False,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
           "--state-dir", str(tmp / "state"), *([] if preflight else ["--no-preflight"]),
           "--", *sglang]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp,
                          stdin=subprocess.DEVNULL, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_port_sglang_rejects_is_exit_2_before_launch(
        tmp_path: Path, config: tuple[Path, Launcher]) -> None:
    path, launcher = config
    done = _run(tmp_path, path, "--model-path", "/m", "--port", "notaport")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.count("\n") == 1 and "--port notaport" in done.stderr
    assert launcher.argvs() == []


def test_run_shows_the_preflight_warnings_check_shows(tmp_path: Path) -> None:
    # a hub id that is not cached, offline: `check` warns, and so must `run` (the launcher
    # then exits at once and the guard gives up: only the warning matters here)
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    cfg = guard_toml(tmp_path, Launcher(tmp_path, [[["exit", 3]]]), pack)
    done = _run(tmp_path, cfg, "--model-path", "no-such-org/no-such-model", "--port", "39999",
                preflight=True)
    assert '"preflight.warning"' in done.stderr, done.stderr
    assert "cannot resolve hub model" in done.stderr


def test_check_says_that_it_does_not_write_the_derived_yaml(tmp_path: Path) -> None:
    model = write_llama(tmp_path / "model")
    user = tmp_path / "sglang.yaml"
    user.write_text(f"model-path: {model}\nattention-backend: cutedsl_mla\n")
    res = CliRunner().invoke(main, ["check", "--gpu-sm", "90", "--state-dir",
                                    str(tmp_path / "state"), "--", "--config", str(user)])
    assert res.exit_code == 1, res.output
    derived = [x for x in res.output.splitlines() if x.startswith("derived")]
    assert derived and "`check` only names it" in derived[0]
    assert not (tmp_path / "state" / "derived").exists()


def test_run_help_names_the_root_default() -> None:
    res = CliRunner().invoke(main, ["run", "--help"])
    assert "/var/lib" in res.output and "port-" in res.output


def test_a_bad_log_format_in_the_environment_is_said(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("SGLANG_GUARD_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("SGLANG_GUARD_LOG_FORMAT", "xml")
    with pytest.raises(InputError, match="SGLANG_GUARD_LOG_FORMAT='xml'"):
        guard_config_from_env()
