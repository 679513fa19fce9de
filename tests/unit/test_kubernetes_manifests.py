"""deploy/kubernetes/: the manifests run the guard as the code documents it.

Command, ports, probe paths, the status listen setting, the termination-message path and
the grace period are checked against the guard's own constants, not against copies.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_guard.cli import main as cli_main
from sglang_guard.core.guardconfig import (
    DEFAULT_STATUS_PORT,
    TERMINATION_LOG,
    RestartSection,
    parse_listen,
)
from sglang_guard.shell.status import ENV_ALLOW_REMOTE, ENV_LISTEN, PROBES

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def pod_specs(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(role, pod spec) of every pod template a workload document holds."""
    if doc["kind"] == "Deployment":
        yield "server", doc["spec"]["template"]["spec"]
    elif doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        yield "server", lwt["leaderTemplate"]["spec"]
        yield "worker", lwt["workerTemplate"]["spec"]


def workloads() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            for role, spec in pod_specs(doc):
                out.append((path.name, role, spec))
    return out


def test_both_examples_are_there() -> None:
    kinds = {doc["kind"] for p in MANIFESTS for doc in yaml.safe_load_all(p.read_text())}
    assert {"Deployment", "LeaderWorkerSet"} <= kinds


@pytest.mark.parametrize(("name", "role", "spec"), workloads())
def test_pod_runs_the_guard_as_documented(name: str, role: str, spec: dict[str, Any]) -> None:
    (container,) = spec["containers"]
    program, command = container["command"]
    assert program in SCRIPTS and SCRIPTS[program] == "sglang_guard.pid1:main"
    assert command in cli_main.commands and command == "serve"
    env = {e["name"]: e.get("value") for e in container["env"]}
    listen = parse_listen(env[ENV_LISTEN], allow_remote=env[ENV_ALLOW_REMOTE] == "1")
    assert listen is not None and listen[1] == DEFAULT_STATUS_PORT
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["status"] == DEFAULT_STATUS_PORT
    want = dict(PROBES) if role == "server" else {
        k: v for k, v in PROBES.items() if k != "readinessProbe"}  # workers serve no HTTP
    got = {k: container[k]["httpGet"] for k in PROBES if k in container}
    assert {k: g["path"] for k, g in got.items()} == want
    assert all(g["port"] in ("status", DEFAULT_STATUS_PORT) for g in got.values())
    assert container["terminationMessagePath"] == TERMINATION_LOG
    # the grace period covers the guard's stop: TERM, stop_grace_s, KILL, and a margin
    assert spec["terminationGracePeriodSeconds"] >= RestartSection().stop_grace_s + 10
    state = env["SGLANG_GUARD_STATE_DIR"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert state in mounts
    assert mounts[state] in {v["name"] for v in spec["volumes"]}
