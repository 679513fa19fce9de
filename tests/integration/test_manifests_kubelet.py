"""Issue 22, item 4: deploy/kubernetes/ as a kubelet would run it, on this host.

Each pod of the manifest is rendered as the kubelet renders it (tests/kubelet.py): its
emptyDirs created 0777, its ConfigMap and Secret volumes in the AtomicWriter layout
(`..data` swapped on update), `$(VAR)` expanded in env and args (POD_IP, LWS's variables),
and its container's command run as PID 1 of a PID namespace. The manifests' own command,
args, env, ConfigMap and mounts are used; what a test host cannot have is replaced: SGLang by
the fake child ([sglang] launch), the GPU (`[gpu] sm = "none"`), the fixed ports by free ones
(tests never bind 9488/9489), the pod IP and the leader's address by 127.0.0.1. Then the
ConfigMap is updated the kubelet's way and the guard must reload it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from sglang_guard.errors import EXIT_OK
from sglang_guard.supervise.machine import READY_LINE
from support.harness import HEALTH_HOST, HealthServer, Launcher, journal_events, wait_for
from support.kubelet import (
    config_map,
    container_env,
    empty_dir,
    expand,
    toml_dump,
    update_config_map,
)
from support.pid1ns import needs_unshare, zombies
from support.procs import free_port
from support.statusport import get

ROOT = Path(__file__).resolve().parents[2]
SECRET = "kubelet-test-group-secret-0123456789"  # noqa: S105 - a test value


@dataclass
class Pod:
    """One rendered pod: its volumes on disk, its guard as PID 1 of a PID namespace."""

    root: Path
    launcher: Launcher
    status_port: int
    config_dir: Path
    state_dir: Path
    guard_toml: dict[str, dict[str, Any]]
    proc: subprocess.Popen[bytes] | None = None
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        """Where the guard keeps its files: its own 0700 dir in the 0777 emptyDir."""
        return self.state_dir / f"sglang-guard-{os.geteuid()}"

    def events(self, name: str) -> list[dict[str, Any]]:
        """The journal's records of one event."""
        if not (self.state / "journal.jsonl").exists():
            return []
        return [r for r in journal_events(self.state) if r["event"] == name]

    def wait(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """The first `name` record, waited for."""
        try:
            return wait_for(lambda: next(iter(self.events(name)), None), timeout=timeout,
                            what=f"{name} in {self.state}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the guard said: {self.stderr()[-3000:]}") from None

    def stderr(self) -> str:
        """What the guard printed on stderr so far."""
        path = self.root / "guard.err"
        return path.read_text(errors="replace") if path.exists() else ""

    def pid1(self) -> psutil.Process:
        """The namespace's PID 1."""
        assert self.proc is not None
        unshare = psutil.Process(self.proc.pid)
        return wait_for(lambda: next(iter(unshare.children()), None), what="PID 1")

    def stop(self) -> tuple[int, str]:
        """SIGTERM to PID 1, as the kubelet sends it; the exit status and stderr."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.pid1().send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return self.proc.returncode, self.stderr()


def manifest(name: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(
        (ROOT / "deploy" / "kubernetes" / name).read_text())}


def render(tmp: Path, docs: dict[str, dict[str, Any]], spec: dict[str, Any], *,
           plans: list[list[list[Any]]], given: dict[str, str], ports: dict[int, int]) -> Pod:
    """Lay out `spec`'s volumes under `tmp` and build its container's command and env."""
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    tmp.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(tmp, plans)
    where: dict[str, Path] = {}  # mountPath -> the directory standing for it here
    config_dir = state_dir = tmp
    guard: dict[str, dict[str, Any]] = {}
    for mount in container["volumeMounts"]:
        volume, path = volumes[mount["name"]], mount["mountPath"]
        local = tmp / "volumes" / mount["name"]
        if "configMap" in volume:
            (cm,) = [docs["ConfigMap"]] if docs["ConfigMap"]["metadata"]["name"] == \
                volume["configMap"]["name"] else []
            guard = tomllib.loads(cm["data"]["guard.toml"])
            config_dir = local
        elif "secret" in volume:
            config_map(local, {"secret": SECRET + "\n"}, mode=volume["secret"]["defaultMode"])
        elif "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            continue  # /dev/shm: the host's
        elif "emptyDir" in volume:
            empty_dir(local)
        elif "persistentVolumeClaim" in volume:  # the models, shared by the group's pods
            local = tmp.parent / "claims" / volume["persistentVolumeClaim"]["claimName"]
            local.mkdir(parents=True, exist_ok=True)
        where[path] = local

    def local(text: str) -> str:
        for path, here in sorted(where.items(), key=lambda kv: -len(kv[0])):
            if text == path or text.startswith(path + "/"):
                return str(here) + text[len(path):]
        return text

    def port(text: str) -> str:
        for fixed, free in ports.items():
            text = text.replace(f":{fixed}", f":{free}")
        return str(ports.get(int(text), text)) if text.isdigit() else text

    env = {k: port(local(v)) for k, v in container_env(container, given).items()}
    args = [port(local(expand(a, {**given, **env}))) for a in container["args"]]
    # SGLang's --host 0.0.0.0 is the pod's every address; here the health server holds the
    # port on another loopback address, so the guard's busy-port check must look at one
    args = ["127.0.0.1" if a == "0.0.0.0" else a for a in args]  # noqa: S104
    for i, arg in enumerate(args):
        if arg == "--model-path" or (i == 0 and not arg.startswith("-")):
            model = Path(args[i + 1] if arg == "--model-path" else arg)
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").write_text(json.dumps(
                {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    # What a test host cannot have: SGLang, a GPU, the fixed ports.
    if "group" in guard:
        guard["group"]["port"] = ports[guard["group"]["port"]]
        guard["group"]["secret_file"] = local(guard["group"]["secret_file"])
        guard["group"].update(heartbeat_s=0.2, leader_lost_s=5.0, join_timeout_s=30.0)
    guard["sglang"] = {"launch": launcher.command}
    guard["health"] = {"host": HEALTH_HOST, "timeout_s": 2.0}
    guard["gpu"] = {"sm": "none"}
    guard.setdefault("restart", {}).update(backoff_initial_s=0.05, backoff_max_s=0.1)
    config_map(config_dir, {"guard.toml": toml_dump(guard)})
    state_dir = Path(env["SGLANG_GUARD_STATE_DIR"])
    status_port = int(env["SGLANG_GUARD_STATUS_LISTEN"].rsplit(":", 1)[1])
    base = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_GUARD_")}
    program, *sub = container["command"]
    assert program == "sglang-guard"
    pod = Pod(tmp, launcher, status_port, config_dir, state_dir, guard)
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "sglang_guard",
           *sub, *args]
    with (tmp / "guard.err").open("wb") as err:
        pod.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                    stdin=subprocess.DEVNULL, cwd=tmp,
                                    env={**base, **env, "SGLANG_GUARD_PREFLIGHT": "0"})
    return pod


def swap_config(pod: Pod) -> None:
    """The ConfigMap edited (a liveness interval) and swapped in as the kubelet does."""
    guard = {**pod.guard_toml, "health": {**pod.guard_toml["health"],
                                          "liveness_interval_s": 45.0}}
    update_config_map(pod.config_dir, {"guard.toml": toml_dump(guard)})


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    made: list[Pod] = []
    yield made
    for pod in made:
        if pod.proc is not None and pod.proc.poll() is None:
            with contextlib.suppress(Exception):
                pod.pid1().kill()
            pod.proc.kill()
            pod.proc.wait(timeout=30)


@needs_unshare
def test_the_deployment_starts_and_reloads_a_configmap_swap(tmp_path: Path,
                                                            pods: list[Pod]) -> None:
    docs = manifest("deployment.yaml")
    spec = docs["Deployment"]["spec"]["template"]["spec"]
    with HealthServer() as health:
        pod = render(tmp_path, docs, spec, plans=[[["print", "stdout", READY_LINE],
                                                   ["wait_term"], ["exit", 0]]],
                     given={"POD_IP": "127.0.0.1"},
                     ports={30000: health.port, 9488: free_port()})
        pods.append(pod)
        assert stat_mode(pod.state_dir) == 0o777  # the kubelet's emptyDir
        pod.wait("ready")
        assert stat_mode(pod.state) == 0o700
        assert get(("127.0.0.1", pod.status_port), "/startupz")[0] == 200
        assert len(pod.launcher.argvs()) == 1
        swap_config(pod)
        applied = pod.wait("reload.applied", timeout=30)
        assert applied["kind"] == "guard_config" and applied["restart"] is False
        assert len(pod.launcher.argvs()) == 1  # a liveness interval needs no relaunch
        assert not zombies(pod.pid1())
        code, err = pod.stop()
    assert code == EXIT_OK, err
    assert "Traceback" not in err


@needs_unshare
def test_the_leaderworkerset_group_starts_and_reloads_a_configmap_swap(
        tmp_path: Path, pods: list[Pod]) -> None:
    docs = manifest("leaderworkerset.yaml")
    lwt = docs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    group_port, dist = free_port(), free_port()
    with HealthServer() as health:
        for rank, template in enumerate(("leaderTemplate", "workerTemplate")):
            plan = [["print", "stdout", READY_LINE]] if rank == 0 else []
            given = {"POD_IP": "127.0.0.1", "LWS_LEADER_ADDRESS": "127.0.0.1",
                     "LWS_WORKER_INDEX": str(rank), "LWS_GROUP_SIZE": str(lwt["size"])}
            pods.append(render(tmp_path / f"pod{rank}", docs, lwt[template]["spec"],
                               plans=[[*plan, ["wait_term"], ["exit", 0]]], given=given,
                               ports={30000: health.port, 9488: free_port(),
                                      9489: group_port, 20000: dist}))
        leader, worker = pods
        worker.wait("ready")  # the leader confirmed rank 0 ready: the group is up
        assert leader.events("group.start") and worker.events("group.start")
        argv = worker.launcher.argvs()[0]
        assert argv[argv.index("--node-rank") + 1] == "1"
        assert SECRET not in json.dumps(leader.events("child.start"))
        for pod in (leader, worker):
            assert get(("127.0.0.1", pod.status_port), "/startupz")[0] == 200
            swap_config(pod)
            assert pod.wait("reload.applied", timeout=30)["kind"] == "guard_config"
        code, err = leader.stop()
        assert code == EXIT_OK, err
        code, err = worker.stop()
        assert code == EXIT_OK, err


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
