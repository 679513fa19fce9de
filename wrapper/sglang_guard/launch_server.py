"""Drop-in for `python -m sglang.launch_server`: the same arguments, under the guard.

    python -m sglang_guard.launch_server --model-path M --port 30000 ...
    sglang-guard-launch --model-path M --port 30000 ...

Guard settings come from the environment (SGLANG_GUARD_CONFIG, SGLANG_GUARD_POLICY,
SGLANG_GUARD_GPU_SM, SGLANG_GUARD_STATE_DIR, SGLANG_GUARD_PYTHON, SGLANG_GUARD_PREFLIGHT=0,
SGLANG_GUARD_LOG_FORMAT) or the first config file found at /etc/sglang-guard/guard.toml,
then $XDG_CONFIG_HOME/sglang-guard/guard.toml.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace

from sglang_guard.cli import guarded
from sglang_guard.core.guardconfig import GuardConfig, with_overrides
from sglang_guard.errors import InputError

LOG_FORMATS = ("auto", "json", "console")

GUARD_LINE = ("\n[sglang-guard] This server runs under sglang-guard: backend flags are checked "
              "against the model and GPU before launch, and fatal log lines are fixed and "
              "restarted. Settings: SGLANG_GUARD_* environment variables or "
              "/etc/sglang-guard/guard.toml.\n")


def guard_config_from_env() -> GuardConfig:
    """The guard config: the file (env or default places), then SGLANG_GUARD_* overrides."""
    from sglang_guard.shell.configfile import locate, read_guard_config  # noqa: PLC0415

    cfg = read_guard_config(locate(None, search_defaults=True))
    cfg = with_overrides(cfg, os.environ.get("SGLANG_GUARD_POLICY"),
                         os.environ.get("SGLANG_GUARD_GPU_SM"),
                         policy_source="SGLANG_GUARD_POLICY")
    if os.environ.get("SGLANG_GUARD_STATE_DIR"):
        cfg = replace(cfg, state_dir=os.environ["SGLANG_GUARD_STATE_DIR"])
    fmt = os.environ.get("SGLANG_GUARD_LOG_FORMAT")
    if fmt:  # a typo is said, as for SGLANG_GUARD_POLICY, not silently ignored
        if fmt not in LOG_FORMATS:
            raise InputError(f"SGLANG_GUARD_LOG_FORMAT={fmt!r}: expected one of "
                             f"{', '.join(LOG_FORMATS)}")
        cfg = replace(cfg, log_format=fmt)  # type: ignore[arg-type]
    return cfg


def python() -> str:
    """The interpreter that has SGLang ($SGLANG_GUARD_PYTHON, else the guard's own)."""
    return os.environ.get("SGLANG_GUARD_PYTHON") or sys.executable


def print_sglang_help(command: Sequence[str], usage: str, timeout: float) -> int:
    """SGLang's own help (`command`, when SGLang is installed), plus one paragraph about the
    guard; `usage` stands in when SGLang cannot print it. Shared with `sglang-guard serve`."""
    try:
        out = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                             check=False)
        text = out.stdout if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    if not text:
        text = (f"usage: {usage}\n\n"
                f"SGLang is not installed for {python()}: its help cannot be shown.\n")
    sys.stdout.write(text + GUARD_LINE)
    return 0


def show_help() -> int:
    """`python -m sglang.launch_server --help`, plus the guard's paragraph."""
    return print_sglang_help([python(), "-m", "sglang.launch_server", "--help"],
                             "sglang-guard-launch [SGLang launch_server arguments]", 120)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `sglang-guard-launch` and `python -m sglang_guard.launch_server`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        sys.exit(show_help())
    _launch(args)


@guarded
def _launch(args: list[str]) -> None:
    from sglang_guard.shell import logsetup  # noqa: PLC0415
    from sglang_guard.shell.runner import RunOptions  # noqa: PLC0415
    from sglang_guard.shell.session import exit_process, run_guarded  # noqa: PLC0415
    from sglang_guard.shell.statelock import default_run_state_dir  # noqa: PLC0415
    from sglang_guard.shell.status import run_with_status  # noqa: PLC0415

    cfg = guard_config_from_env()
    logsetup.configure(cfg.log_format)
    opts = RunOptions(argv=tuple(args), python=python(),
                      state_dir=cfg.state_dir or default_run_state_dir(args),
                      preflight=os.environ.get("SGLANG_GUARD_PREFLIGHT", "1") != "0")
    exit_process(run_guarded(cfg, opts, run_with_status))


if __name__ == "__main__":
    from sglang_guard.pid1 import init_if_pid1

    init_if_pid1()  # a container's first process: a minimal init in front (pid1.py)
    main()
