"""The console scripts: a minimal init in front when the guard is PID 1 (pid1.py), then the
command. The init half imports neither the CLI nor the drop-in, so it stays small."""

from __future__ import annotations

from sglang_guard.pid1 import init_if_pid1


def main() -> None:
    """`sglang-guard` (and `python -m sglang_guard`)."""
    init_if_pid1()
    from sglang_guard import cli  # noqa: PLC0415 - the init half never imports the CLI

    cli.main()


def launch() -> None:
    """`sglang-guard-launch` (the drop-in for `python -m sglang.launch_server`)."""
    init_if_pid1()
    from sglang_guard import launch_server  # noqa: PLC0415

    launch_server.main()
