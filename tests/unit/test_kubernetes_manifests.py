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
from sglang_guard.config.guardconfig import (
    DEFAULT_STATUS_PORT,
    TERMINATION_LOG,
    RestartSection,
    parse_listen,
)
from sglang_guard.status.shell.status import ENV_ALLOW_REMOTE, ENV_LISTEN, PROBES

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
    assert program in SCRIPTS and SCRIPTS[program] == "sglang_guard.start:main"
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


def configmap_guard(name: str) -> Any:
    """The guard config the manifest's ConfigMap holds."""
    from sglang_guard.config.guardconfig import parse_guard_config  # noqa: PLC0415

    (doc,) = [d for p in MANIFESTS if p.name == name for d in yaml.safe_load_all(p.read_text())
              if d["kind"] == "ConfigMap"]
    return parse_guard_config(doc["data"]["guard.toml"], f"{name}: ConfigMap")


@pytest.mark.parametrize(("name", "role", "spec"), workloads())
def test_pod_is_locked_down_and_every_writable_path_is_a_volume(
        name: str, role: str, spec: dict[str, Any]) -> None:
    from sglang_guard.config.guardconfig import StartSection  # noqa: PLC0415
    from sglang_guard.rules.stages import STAGES  # noqa: PLC0415

    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] >= 10000  # a fixed, non-root UID
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    sec = container["securityContext"]
    assert sec["allowPrivilegeEscalation"] is False and sec["privileged"] is False
    assert sec["readOnlyRootFilesystem"] is True
    assert sec["capabilities"]["drop"] == ["ALL"] and "add" not in sec["capabilities"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for path in (env["SGLANG_GUARD_STATE_DIR"], env["TMPDIR"], env["HOME"],
                 env["XDG_CACHE_HOME"], "/dev/shm"):
        assert path in mounts, path
    # the status port binds the pod's IP (where the kubelet probes), not every address
    assert env[ENV_LISTEN].startswith("$(POD_IP):")
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in \
        container["env"]
    # the grace period covers the configured stop; the startup budget the longest start
    guard = configmap_guard(name)
    assert spec["terminationGracePeriodSeconds"] >= guard.restart.stop_grace_s + 10
    probe = container["startupProbe"]
    longest = sum(StartSection().limit(stage) for stage in STAGES)
    assert probe["periodSeconds"] * probe["failureThreshold"] >= longest


def test_the_lws_group_is_authenticated_and_fenced() -> None:
    from sglang_guard.config.guardconfig import DEFAULT_GROUP_PORT  # noqa: PLC0415

    cfg = configmap_guard("leaderworkerset.yaml").group
    assert cfg.secret_file and not cfg.insecure
    assert cfg.bind == "auto"  # the leader host, never 0.0.0.0
    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (ROOT / "deploy" / "kubernetes" / "leaderworkerset.yaml").read_text())}
    lwt = docs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    name = docs["LeaderWorkerSet"]["metadata"]["name"]
    for template in ("leaderTemplate", "workerTemplate"):
        spec = lwt[template]["spec"]
        (container,) = spec["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = mounts[str(Path(cfg.secret_file).parent)]
        (secret,) = [v for v in spec["volumes"] if v["name"] == volume]
        assert secret["secret"]["secretName"]  # a Secret, mounted in both pod templates
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"]["matchLabels"]["leaderworkerset.sigs.k8s.io/name"] == name
    for rule in policy["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        if not ports or DEFAULT_GROUP_PORT in ports:  # the group port is reachable by it
            (peer,) = rule["from"]
            assert peer == {"podSelector": {"matchLabels": {
                "leaderworkerset.sigs.k8s.io/name": name}}}
    service = docs["Service"]["spec"]
    assert service["selector"] == {"leaderworkerset.sigs.k8s.io/name": name, "role": "leader"}
