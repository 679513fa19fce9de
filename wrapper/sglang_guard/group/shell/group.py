"""A multi-node group's shell: the facts of a node's digest, and the wiring of its link.

What either side decides is in `group/group.py`; the leader's endpoint is `groupleader.py`,
a worker's heartbeat `groupworker.py`, the link protocol and the POST `groupwire.py`. The
supervisor calls a link's `saw_event` before each step and `saw_action` before each action;
the links only put events on the loop's queue. Nothing else of the loop knows the group.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from sglang_guard.common.outcomes import ReloadApplied
from sglang_guard.common.shell.files import read_bytes
from sglang_guard.config.guardconfig import GroupSection
from sglang_guard.errors import InputError
from sglang_guard.group import group as core
from sglang_guard.group.groupauth import check_secret
from sglang_guard.group.shell.groupleader import LeaderLink, Learned, Record
from sglang_guard.group.shell.groupworker import WorkerLink
from sglang_guard.preflight.facts import GpuFacts
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.supervise.machine import Env
from sglang_guard.supervise.shell.observer import Listener
from sglang_guard.supervise.shell.reloader import ReloadOutcome

__all__ = ["Learned", "local_digest", "open_group", "worker_reload"]

Reload = Callable[[str, "str | None", Env], ReloadOutcome]
MAX_SECRET = 4096  # bytes a secret file may hold


# -- facts for the digest -------------------------------------------------------------------


def model_config_hash(model_path: str | None, revision: str | None) -> str | None:
    """sha256 of the model's config.json (a local directory, else the local hub cache)."""
    if not model_path:
        return None
    local = Path(model_path).expanduser() / "config.json"
    path: str | None = str(local) if local.is_file() else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415
        except ImportError:
            return None
        with contextlib.suppress(Exception):  # an id the cache cannot hold: unknown
            cached = try_to_load_from_cache(model_path, "config.json", revision=revision)
            path = cached if isinstance(cached, str) else None
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def gpu_count(gpu: GpuFacts) -> int | None:
    """The GPUs this node's SGLang sees: CUDA_VISIBLE_DEVICES, else NVML; None when unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if gpu.source != "nvml":
        return None
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # any NVML failure: cannot tell
        return None


def local_digest(cl: CommandLine, sglang: str | None, gpu: GpuFacts, *,
                 rules: object = None, policy: object = None,
                 key: bytes | None = None) -> core.Digest:
    """This node's digest of the inputs its launch is decided from: the command line, the
    model, the release, the GPUs, and the rules and policy that decide what it reports."""
    return core.make_digest(cl, model_config_hash(cl.value("model_path"), cl.value("revision")),
                            sglang, gpu.sm, gpu_count(gpu), rules=_sha(rules),
                            policy=_sha(policy), key=key)


def _sha(value: object) -> str | None:
    return None if value is None else hashlib.sha256(repr(value).encode()).hexdigest()


def group_secret(cfg: GroupSection) -> bytes | None:
    """The group's shared secret from `[group] secret_file`; None only with `insecure`.

    A multi-node guard without one refuses to start (exit 2): anyone who reaches the group
    port could otherwise read the launch and steer every node.
    """
    if not cfg.secret_file:
        if cfg.insecure:
            return None
        raise InputError("a multi-node group needs [group] secret_file (a file holding the "
                         "group's shared secret, the same on every node), or [group] insecure "
                         "= true on a network only the group's nodes reach")
    try:
        secret = read_bytes(cfg.secret_file, limit=MAX_SECRET).strip()
    except OSError as exc:
        raise InputError(f"[group] secret_file {cfg.secret_file}: cannot read it "
                         f"({exc.strerror or exc})") from None
    problem = check_secret(secret)
    if problem is not None:
        raise InputError(f"[group] secret_file {cfg.secret_file}: {problem}")
    return secret


# -- wiring (supervise/shell/runner.py) ------------------------------------------------------------


def open_group(spec: core.GroupSpec, cfg: GroupSection, cl: CommandLine, gpu: GpuFacts,
               env: Env, *, state_dir: str, policy: object = None,
               allow_set: Collection[str] = (), record: Record | None = None
               ) -> tuple[Listener, CommandLine, Env, CommandLine | None]:
    """Lead or join: the link, the command line to launch first, the machine's Env, and the
    learned command line the leader replays (None: none). `record`: the journal's write."""
    secret = group_secret(cfg)
    digest = local_digest(cl, env.sglang_version, gpu, rules=env.matcher.rules,
                          policy=(policy, tuple(allow_set)), key=secret)
    if spec.leads:
        learned = Learned(state_dir, digest, cl, allow_set=allow_set, record=record)
        replayed = learned.replay(env.options)
        link = LeaderLink(spec, cfg, digest, env.derived_dir, learned=learned, secret=secret,
                          record=record)
        return link, replayed or cl, replace(env, role="leader"), replayed
    worker = WorkerLink(spec, cfg, digest, options=env.options, matcher=env.matcher,
                        derived_dir=env.derived_dir, secret=secret, own=cl)
    first = worker.join()
    # A worker's own /health is SGLang's dummy (always 200 on ranks >= 1): never probed.
    env = replace(env, role="worker", health=replace(env.health, enabled=False))
    return worker, first, env, None


def worker_reload(reload: Reload) -> Reload:
    """A worker applies a reloaded rule pack or policy, never a command line of its own."""

    def wrapped(kind: str, path: str | None, env: Env) -> ReloadOutcome:
        outcome = reload(kind, path, env)
        if outcome.cl is None:
            return outcome
        note = "a group worker launches what its leader launches; restart the group to apply it"
        record = outcome.record
        if isinstance(record, ReloadApplied):
            record = replace(record, note=note)
        return replace(outcome, cl=None, record=record)

    return wrapped
