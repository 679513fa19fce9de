"""Drop-in for `python -m sglang.launch_server`: the same arguments, under the guard.

    python -m sglang_guard.launch_server --model-path M --port 30000 ...
    sglang-guard-launch --model-path M --port 30000 ...

Guard settings come from the environment (SGLANG_GUARD_CONFIG, SGLANG_GUARD_POLICY,
SGLANG_GUARD_GPU_SM, SGLANG_GUARD_STATE_DIR, SGLANG_GUARD_PYTHON, SGLANG_GUARD_PREFLIGHT=0,
SGLANG_GUARD_LOG_FORMAT) or the first config file found at /etc/sglang-guard/guard.toml,
then $XDG_CONFIG_HOME/sglang-guard/guard.toml. The run itself is entry.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sglang_guard.entry import (
    guard_config_from_env,
    guarded,
    preflight_from_env,
    print_sglang_help,
    python,
    run_process,
)


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
    run_process(guard_config_from_env(), args, python=python(), preflight=preflight_from_env())


if __name__ == "__main__":
    from sglang_guard.pid1 import init_if_pid1

    init_if_pid1()  # a container's first process: a minimal init in front (pid1.py)
    main()
