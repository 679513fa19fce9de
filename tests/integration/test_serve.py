"""`sglang-guard serve ARGS…`: `sglang serve`'s arguments, the child launched as `sglang serve`.

The environment's `sglang` script is the fake child's launcher (beside a `python` link), so
the argv SGLang would see is recorded as it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sglang_guard.errors import EXIT_OK
from sglang_guard.sglang.launcher import split_args
from support.guards import guard_toml
from support.harness import HealthServer, Launcher, count, ready_then_wait, wait_for
from support.notify import Listener
from support.pack import PACK_TEXT


def test_split_args_reads_the_argv_as_sglang_serve_does() -> None:
    assert split_args(["/models/m", "--port", "1"]) == ((), ("--model-path", "/models/m",
                                                              "--port", "1"))
    assert split_args(["--model-type", "llm", "--model-path", "/m"]) == (
        ("--model-type", "llm"), ("--model-path", "/m"))
    assert split_args(["/m", "--model-type=llm", "--tp", "2"]) == (
        ("--model-type=llm",), ("--model-path", "/m", "--tp", "2"))
    assert split_args(["--port", "1"]) == ((), ("--port", "1"))


def _env(tmp_path: Path, launcher: Launcher, *, with_launch: bool) -> dict[str, str]:
    pack = tmp_path / "rules.toml"
    pack.write_text(PACK_TEXT)
    config = guard_toml(tmp_path, launcher, pack)
    if not with_launch:  # the guard finds `sglang` beside the interpreter instead
        config.write_text("\n".join(line for line in config.read_text().splitlines()
                                    if not line.startswith("launch =")) + "\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    script = bindir / "sglang"
    script.write_text(f"#!/bin/sh\nexec {' '.join(launcher.command)} \"$@\"\n")
    script.chmod(0o755)
    return {**os.environ, "SGLANG_GUARD_CONFIG": str(config),
            "SGLANG_GUARD_PYTHON": str(bindir / "python"), "SGLANG_GUARD_PREFLIGHT": "0",
            "SGLANG_GUARD_STATE_DIR": str(tmp_path / "state"),
            "SGLANG_GUARD_STATUS_LISTEN": "off"}


def _serve_until_ready(tmp_path: Path, env: dict[str, str], args: list[str]) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "sglang_guard", "serve", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: count(tmp_path / "state", "ready") >= 1, what="ready")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


def test_serve_launches_sglang_serve_with_the_same_arguments(
        tmp_path: Path, server: HealthServer) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    env = _env(tmp_path, launcher, with_launch=False)
    args = ["/models/fake", "--port", str(server.port), "--model-type", "llm"]
    assert _serve_until_ready(tmp_path, env, args) == EXIT_OK
    assert launcher.argvs() == [["serve", "--model-type", "llm", "--model-path", "/models/fake",
                                 "--port", str(server.port)]]


def test_a_configured_launch_command_is_kept(tmp_path: Path, server: HealthServer
                                             ) -> None:
    launcher = Launcher(tmp_path, [ready_then_wait()])
    env = _env(tmp_path, launcher, with_launch=True)
    assert _serve_until_ready(tmp_path, env, ["/models/fake", "--port", str(server.port)]) == 0
    assert launcher.argvs() == [["--model-path", "/models/fake", "--port", str(server.port)]]


def _pin_release(env: dict[str, str], version: str) -> None:
    config = Path(env["SGLANG_GUARD_CONFIG"])
    config.write_text(config.read_text().replace("[sglang]\n", f'[sglang]\nversion = "{version}"\n',
                                                 1))


def test_a_line_the_releases_serve_fails_is_refused_unlaunched(
        tmp_path: Path, server: HealthServer) -> None:
    """SGLang 0.5.12's `sglang serve` reads no bare model path (0.5.16 on does): it would fail
    with "--model-path is required", so the guard says that and launches nothing."""
    launcher = Launcher(tmp_path, [ready_then_wait()])
    env = _env(tmp_path, launcher, with_launch=False)
    _pin_release(env, "0.5.12")
    done = subprocess.run([sys.executable, "-m", "sglang_guard", "serve", "/models/fake",
                           "--port", str(server.port)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "--model-path is required" in said[0], done.stderr
    assert "0.5.12" in said[0] and "Traceback" not in done.stderr
    assert launcher.argvs() == []


def test_an_older_releases_serve_keeps_its_own_words(tmp_path: Path, server: HealthServer
                                                     ) -> None:
    """On 0.5.12 `--model-type` is serve's own and `--model-path` names the model: launched
    as given, the selector kept with the launch command."""
    launcher = Launcher(tmp_path, [ready_then_wait()])
    env = _env(tmp_path, launcher, with_launch=False)
    _pin_release(env, "0.5.12")
    args = ["--model-path", "/models/fake", "--port", str(server.port), "--model-type", "llm"]
    assert _serve_until_ready(tmp_path, env, args) == EXIT_OK
    assert launcher.argvs() == [["serve", "--model-type", "llm", "--model-path", "/models/fake",
                                 "--port", str(server.port)]]


def test_serve_help_without_sglang_says_so() -> None:
    env = {**os.environ, "SGLANG_GUARD_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "sglang_guard", "serve", "--help"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0
    assert "usage: sglang-guard serve" in out.stdout
    assert "SGLang is not installed" in out.stdout


def test_a_diffusion_pipeline_is_handed_to_sglang_serve_unguarded(tmp_path: Path) -> None:
    # SGLang serves a diffusers directory with its diffusion runtime (sglang/cli/serve.py:109),
    # whose flags the guard has no table of: the guard must neither refuse it ("no
    # config.json") nor judge its flags, but start `sglang serve` exactly as written.
    launcher = Launcher(tmp_path, [[["print", "stdout", "diffusion up"], ["exit", 7]]])
    env = {**_env(tmp_path, launcher, with_launch=False), "SGLANG_GUARD_PREFLIGHT": "1"}
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "model_index.json").write_text('{"_diffusers_version": "0.30.0"}')
    args = [str(pipe), "--num-gpus", "1", "--attention-backend", "fa"]
    out = subprocess.run([sys.executable, "-m", "sglang_guard", "serve", *args], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 7, out.stderr  # the child's own status: the guard is not there
    assert out.stdout == "diffusion up\n"
    assert "is a diffusers pipeline" in out.stderr and "unguarded" in out.stderr
    assert launcher.argvs() == [["serve", *args]]
    assert not (tmp_path / "state").exists()  # no run: no journal, no lock


def test_run_with_a_sglang_serve_launch_hands_a_pipeline_over_too(tmp_path: Path) -> None:
    # `[sglang] launch = [".../sglang", "serve"]` under `sglang-guard run`: the same reading
    launcher = Launcher(tmp_path, [[["print", "stdout", "diffusion up"], ["exit", 5]]])
    env = _env(tmp_path, launcher, with_launch=False)
    config = Path(env["SGLANG_GUARD_CONFIG"])
    sglang = Path(env["SGLANG_GUARD_PYTHON"]).with_name("sglang")
    config.write_text(f'[sglang]\nlaunch = ["{sglang}", "serve"]\n' + config.read_text()
                      .replace("[sglang]\n", "", 1))
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "model_index.json").write_text('{"_diffusers_version": "0.30.0"}')
    args = ["--model-path", str(pipe), "--num-gpus", "1"]
    out = subprocess.run([sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
                          "--", *args], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 5, out.stderr
    assert out.stdout == "diffusion up\n" and "unguarded" in out.stderr
    assert launcher.argvs() == [["serve", *args]]


def test_run_with_a_sglang_serve_launch_refuses_what_that_release_fails(tmp_path: Path) -> None:
    """`run` under `[sglang] launch = [".../sglang", "serve"]` on a pinned 0.5.12: the bare
    model path its serve cannot read is refused before anything starts."""
    launcher = Launcher(tmp_path, [ready_then_wait()])
    env = _env(tmp_path, launcher, with_launch=False)
    config = Path(env["SGLANG_GUARD_CONFIG"])
    sglang = Path(env["SGLANG_GUARD_PYTHON"]).with_name("sglang")
    config.write_text(f'[sglang]\nlaunch = ["{sglang}", "serve"]\nversion = "0.5.12"\n'
                      + config.read_text().replace("[sglang]\n", "", 1))
    out = subprocess.run([sys.executable, "-m", "sglang_guard", "run", "--config", str(config),
                          "--", "/models/fake", "--port", "1"], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert "--model-path is required" in out.stderr and "Traceback" not in out.stderr
    assert launcher.argvs() == []


def test_a_handed_over_pipeline_tells_systemd_and_hides_its_socket(tmp_path: Path) -> None:
    # Under Type=notify the exec'd `sglang serve` keeps the pid and would never send READY=1
    # or WATCHDOG=1: the guard says the start is done and turns the watchdog off first; the
    # server does not see systemd's variables (as a guarded child does not).
    seen = tmp_path / "child-env.json"
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    env = _env(tmp_path, launcher, with_launch=False)
    dump = ("import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)));"
            " os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")
    script = Path(env["SGLANG_GUARD_PYTHON"]).with_name("sglang")
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c {dump!r} {seen} "
                      f"{launcher.command[1]} \"$@\"\n")
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "model_index.json").write_text('{"_diffusers_version": "0.30.0"}')
    listener = Listener(tmp_path / "notify.sock")
    try:
        env = {**env, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "300000",
               "WATCHDOG_PID": "1"}
        out = subprocess.run([sys.executable, "-m", "sglang_guard", "serve", str(pipe)], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        wait_for(lambda: "READY=1" in listener.fields(), what="READY=1")
        fields = listener.fields()
        assert "WATCHDOG_USEC=0" in fields
        assert any(f.startswith("STATUS=sglang serve runs unguarded") for f in fields)
    finally:
        listener.close()
    child_env = json.loads(seen.read_text())
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert name not in child_env, name
    assert launcher.argvs() == [["serve", str(pipe)]]
