"""The console scripts: a minimal init in front when the guard is PID 1 (pid1.py), then the
command. The init half imports neither the CLI nor the drop-in, so it stays small."""

from __future__ import annotations

from sglang_guard.pid1 import init_if_pid1


def main() -> None:
    """`sglang-guard` (and `python -m sglang_guard`)."""
    init_if_pid1()
    import gc  # noqa: PLC0415
    import sys  # noqa: PLC0415

    # A plain `check` is one short process whose garbage is mostly acyclic: the collector's
    # passes over what it imports (~4% of a cached check's instructions) and the interpreter's
    # three full collections at exit (~6%) are work for nothing. It runs with the collector
    # off and everything frozen before the exit (gc.freeze: the exit's collections skip it;
    # atexit, the streams' flush and every module's teardown stay as they are). Any other
    # command turns the collector back on before it imports more.
    gc.disable()
    from sglang_guard import checkcmd  # noqa: PLC0415 - the init half never imports the CLI

    params = checkcmd.plain_check_args(sys.argv[1:])
    if params is not None:  # a plain `check`: click's import is a tenth of it (checkcmd.py)
        from sglang_guard.preflight.shell import warmprobe  # noqa: PLC0415

        warmprobe.start(params["args"])  # uncached facts: transformers imports alongside
        try:
            checkcmd.run_plain(params)  # exits
        finally:
            gc.freeze()
    gc.enable()
    from sglang_guard import cli  # noqa: PLC0415

    cli.main()


def launch() -> None:
    """`sglang-guard-launch` (the drop-in for `python -m sglang.launch_server`)."""
    init_if_pid1()
    from sglang_guard import launch_server  # noqa: PLC0415

    launch_server.main()
