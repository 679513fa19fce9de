"""Real SGLang 0.5.23 on CPU as rank 0 of a two-node group whose rank 1 never comes.

Rank 0 alone waits in torch.distributed's init with no progress line (a real start hang).
Its guard leads the group; node 1's guard never joins, so after `[group] join_timeout_s`
the leader reports the node down with the stage the group is stuck in, and acts per its
limits: here `max_failures = 1`, so it gives up (75) and leaves no process behind.

A full two-node group does not start on this CPU test bed: with `--tp 2` SGLang's pynccl
path demands CUDA ("Expected a cuda device, but got: cpu"; ../shared/sglang-versions.md).
The group's fix-and-restart path is tested with real guards and fake SGLang children in
tests/group instead.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_GIVE_UP

from .guardproc import guard_process, guard_run_cmd, sglang_args
from .models import write_tiny_llama
from .server import free_port

pytestmark = pytest.mark.e2e

# The group's limit for "every node up": SGLang's own start on 2 cores takes ~25 s before it
# blocks in distributed init, so the limit leaves it well over half a minute there.
JOIN_S = 60.0
# SGLang's CPU start-up (imports, the scheduler process) before it blocks, plus the stop.
MARGIN_S = 90.0


def test_rank0_alone_hangs_in_distributed_init_and_the_group_limit_acts(
        sglang_python: str, tmp_path: Path) -> None:
    model, port, state = write_tiny_llama(tmp_path / "llama"), free_port(), tmp_path / "state"
    toml, secret = tmp_path / "guard.toml", tmp_path / "group.secret"
    secret.write_text("e2e-group-secret-0123456789\n")
    toml.write_text("\n".join([
        "[restart]", "max_failures = 1", "stop_grace_s = 10.0",
        "[health]", "liveness_interval_s = 600.0",
        "[group]", f"port = {free_port()}", f"join_timeout_s = {JOIN_S}",
        f'secret_file = "{secret}"',
    ]) + "\n")
    args = sglang_args(model, port, ["--tp", "2", "--nnodes", "2", "--node-rank", "0",
                                     "--dist-init-addr", f"127.0.0.1:{free_port()}"])
    cmd = guard_run_cmd(sglang_python, state, args, options=["--config", str(toml)])
    started = time.monotonic()
    with guard_process(cmd, state_dir=state, log_path=tmp_path / "guard.log",
                       env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}) as guard:
        guard.wait_event("child.start", timeout=60)
        code = guard.wait_exit(timeout=JOIN_S + MARGIN_S)
        elapsed = time.monotonic() - started
        assert code == EXIT_GIVE_UP, guard.describe()
        guard.assert_tree_gone()
        (down,) = guard.events("group.node_down")
        assert down["node"] == 1
        assert down["stage"] == "distributed init"
        assert f"within {JOIN_S:g}s" in down["reason"]
        assert not guard.events("ready")
        # Still running when the limit came: stopped by the guard, not crashed on its own.
        assert [e["returncode"] for e in guard.events("child.exit")] == [-15]
        (give_up,) = guard.events("give_up")
        assert "crash loop: 1 failures" in give_up["reason"]
    assert JOIN_S <= elapsed < JOIN_S + MARGIN_S
