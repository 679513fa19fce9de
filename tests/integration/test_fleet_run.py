"""Fleet memory end to end: guards as processes, a fake SGLang, a real etcd or a shared directory.

The fake SGLang behaves by its command line, as SGLang does: with `--attention-backend fa3`
it prints FlashAttention's fatal line and exits 1, otherwise it says ready and serves until
SIGTERM. Two guards with their own state dirs and the same inputs: the first learns the fix
and publishes it; the second launches with it and never fails.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.config.guardconfig import LearnSection
from sglang_guard.errors import EXIT_OK
from sglang_guard.fleet import fleet as core
from sglang_guard.fleet.shell.fleet import guard_id
from sglang_guard.fleet.shell.fleetstore import Store, open_store
from support.etcdserver import ETCD, EtcdServer
from support.guards import Guard, finish
from support.harness import HEALTH_HOST, HealthServer, journal_events, wait_for
from support.pack import FA3_LINE, PACK_TEXT
from support.procs import free_port

SGLANG = """
import json, signal, sys
sys.path.insert(0, {fakedir!r})
import fakechild
with open({record!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
argv = sys.argv[1:]
if "--disable-cuda-graph" in argv:  # a crash no rule reads
    sys.exit(1)
if "--attention-backend" in argv and argv[argv.index("--attention-backend") + 1] == "fa3":
    fakechild.run([["print", "stderr", {fatal!r}], ["exit", 1]])
    sys.exit(1)
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
fakechild.run([["print", "stdout", "The server is fired up and ready to roll!"],
               ["wait_term"], ["exit", 0]])
"""


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 128, "max_position_embeddings": 2048}


class Fleet:
    """The shared pieces: a store URL, the fake SGLang, the model, the rule pack."""

    def __init__(self, tmp: Path, url: str, learn: dict[str, Any] | None = None) -> None:
        self.tmp, self.url, self.learn = tmp, url, learn or {}
        self.record = tmp / "argv.jsonl"
        script = tmp / "sglang.py"
        script.write_text(SGLANG.format(fakedir=str(Path(__file__).parent.parent),
                                        record=str(self.record), fatal=FA3_LINE))
        self.launch = [sys.executable, str(script)]
        self.model = tmp / "model"
        self.model.mkdir()
        (self.model / "config.json").write_text(json.dumps(LLAMA))
        self.pack = tmp / "rules.toml"
        self.pack.write_text(PACK_TEXT.replace('">=0.5.23"', '">=0.5.0"'))

    def config(self, name: str, *, sm: str = "90", version: str = "0.5.23",
               max_failures: int = 3, status: str = "off", **learn: Any) -> Path:
        """A guard config for one guard of the fleet."""
        merged = {"store": self.url, **self.learn, **learn}
        lines = ["[sglang]", f"launch = {json.dumps(self.launch)}", f'version = "{version}"',
                 "[restart]", f"max_failures = {max_failures}", "backoff_initial_s = 0.01",
                 "backoff_max_s = 0.05", "stop_grace_s = 2.0",
                 "[health]", f'host = "{HEALTH_HOST}"', "timeout_s = 2.0",
                 "[rules]", "default_pack = false", f"packs = [{json.dumps(str(self.pack))}]",
                 "[gpu]", f'sm = "{sm}"', "[log]", 'format = "json"',
                 "[status]", f'listen = "{status}"', "[learn]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in merged.items()]
        path = self.tmp / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def argv(self, port: int) -> list[str]:
        """The user's command line: fa3, which this fake's 'GPU' cannot run."""
        return ["--model-path", str(self.model), "--port", str(port), "--api-key", "sekrit-9",
                "--attention-backend", "fa3"]

    def launches(self) -> list[list[str]]:
        """Every launch's argv so far (all guards)."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def store(self) -> Store:
        """The store, as the test writes it directly."""
        return open_store(LearnSection(store=self.url, **self.learn))


@pytest.fixture(params=["file", "etcd"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    if request.param == "file":
        yield Fleet(tmp_path, f"file://{tmp_path / 'shared'}")
        return
    if ETCD is None:
        pytest.skip("etcd-server is not installed")
    server = EtcdServer(tmp_path).start()
    server.enable_auth("pw-25")
    (tmp_path / "etcd-password").write_text("pw-25\n")
    learn = {"user": "root", "password_file": str(tmp_path / "etcd-password")}
    f = Fleet(tmp_path, f"etcd://127.0.0.1:{server.client_port}/fleet", learn)
    f.etcd = server  # type: ignore[attr-defined]
    yield f
    server.stop()


@pytest.fixture
def run_guard(request: pytest.FixtureRequest) -> Guard:
    """`sglang-guard run` as a process (test_cli_run's `guard` fixture)."""
    start: Guard = request.getfixturevalue("guard")
    return start


def events(state: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in journal_events(state) if r["event"] == name]


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return str(resp.read().decode())


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == EXIT_OK, err
    return err


def learn_once(fleet: Fleet, run_guard: Guard, port: int, name: str = "a") -> Path:
    """Guard `name` meets the fatal line, fixes it, reaches ready, publishes; then stops."""
    state = fleet.tmp / f"state-{name}"
    proc = run_guard(fleet.config(name), fleet.argv(port), state_dir=state)
    wait_for(lambda: events(state, "fleet.published"), what="published")
    stop(proc)
    return state


def test_second_guard_launches_with_the_learned_fix_and_never_fails(
        fleet: Fleet, run_guard: Guard) -> None:
    with HealthServer() as server:
        first = learn_once(fleet, run_guard, server.port)
        assert len(fleet.launches()) == 2  # the fatal line cost the first guard one launch
        assert [r["result"] for r in events(first, "fleet.lookup")] == ["miss"]

        state = fleet.tmp / "state-b"
        status_port = free_port()
        proc = run_guard(fleet.config("b", status=f"127.0.0.1:{status_port}"),
                         fleet.argv(server.port), state_dir=state)
        wait_for(lambda: events(state, "fleet.confirmed"), what="confirmed")
        shown = json.loads(_get(status_port, "/status"))
        metrics = _get(status_port, "/metrics")
        err = stop(proc)
    assert shown["fleet_fix"]["key"] == events(state, "fleet.lookup")[0]["key"]
    assert shown["fleet_fix"]["edits"][0]["flag"] == "--attention-backend"
    for kind in ("lookup", "hit", "confirm"):
        assert f'sglang_guard_fleet_total{{kind="{kind}"}} 1.0' in metrics
    assert 'sglang_guard_fleet_total{kind="store_error"} 0.0' in metrics
    launches = fleet.launches()
    assert len(launches) == 3  # the second guard: one launch, right the first time
    assert "--attention-backend" not in launches[2]
    records = journal_events(state)
    assert [r["event"] for r in records if r["event"] == "child.exit"] == ["child.exit"]
    assert not [r for r in records if r["event"] == "remediated" and r["trigger"] == "log"]
    fix = events(state, "remediated")
    assert len(fix) == 1
    assert {k: fix[0][k] for k in ("trigger", "flag", "action", "old_value")} == {
        "trigger": "fleet", "flag": "--attention-backend", "action": "drop_flag",
        "old_value": "fa3"}
    assert fix[0]["origin"]["guard"] == guard_id(LearnSection(), str(first))  # the first guard
    assert events(state, "fleet.lookup")[0]["result"] == "hit"
    key = fix[0]["key"]
    entry = core.decode_entry(fleet.store().get(key) or b"", key)
    assert entry.status == "proven" and entry.confirmations == 1
    assert entry.rules == ("fa3-sm",) and entry.lines == (FA3_LINE,) and entry.launches == 1
    shared = json.dumps(entry.to_json())
    assert "sekrit-9" not in shared and str(server.port) not in shared
    assert "sekrit-9" not in err and "sekrit-9" not in (state / "journal.jsonl").read_text()


@pytest.mark.parametrize("other", [{"sm": "80"}, {"version": "0.5.18"}])
def test_a_different_gpu_or_release_does_not_take_it(
        fleet: Fleet, run_guard: Guard, other: dict[str, str]) -> None:
    with HealthServer() as server:
        learn_once(fleet, run_guard, server.port)
        state = fleet.tmp / "state-c"
        proc = run_guard(fleet.config("c", **other), fleet.argv(server.port), state_dir=state)
        wait_for(lambda: events(state, "fleet.published"), what="published on its own")
        stop(proc)
    assert [r["result"] for r in events(state, "fleet.lookup")] == ["miss"]
    assert len(fleet.launches()) == 4  # it paid for its own failed launch
    assert len(fleet.store().names()) == 2


def test_a_poisoned_entry_is_refused_with_a_journal_line(fleet: Fleet, run_guard: Guard) -> None:
    with HealthServer() as server:
        learned = learn_once(fleet, run_guard, server.port)
        key = events(learned, "fleet.published")[0]["key"]
        store = fleet.store()
        entry = core.decode_entry(store.get(key) or b"", key)
        poisoned = core.Entry(key, "proven", (core.FleetEdit("--trust-remote-code", "set_flag"),
                                              *entry.edits), entry.rules, entry.lines, 1,
                              entry.origin)
        store.put(key, poisoned.encode())
        state = fleet.tmp / "state-d"
        proc = run_guard(fleet.config("d"), fleet.argv(server.port), state_dir=state)
        wait_for(lambda: events(state, "fleet.published"), what="learned alone")
        stop(proc)
    refused = events(state, "fleet.refused")
    assert len(refused) == 1 and "--trust-remote-code is on the deny list" in refused[0]["reason"]
    assert fleet.launches()[2] == fleet.argv(server.port)  # nothing of the entry applied
    assert not [r for r in events(state, "remediated") if r["trigger"] == "fleet"]
    again = core.decode_entry(store.get(key) or b"", key)
    assert again.edits == entry.edits  # what it learned alone replaced the poisoned entry


def test_a_fleet_fix_that_fails_is_marked_known_bad_and_the_guard_goes_on_alone(
        fleet: Fleet, run_guard: Guard) -> None:
    with HealthServer() as server:
        learned = learn_once(fleet, run_guard, server.port)
        key = events(learned, "fleet.published")[0]["key"]
        store = fleet.store()
        entry = core.decode_entry(store.get(key) or b"", key)
        # A fix that looks right and is not: the fake crashes with it, and no rule reads why.
        wrong = core.Entry(key, "proven", (core.FleetEdit("--disable-cuda-graph", "set_flag"),),
                           entry.rules, entry.lines, 1, entry.origin)
        store.put(key, wrong.encode())
        state = fleet.tmp / "state-e"
        proc = run_guard(fleet.config("e"), fleet.argv(server.port), state_dir=state)
        wait_for(lambda: events(state, "fleet.known_bad"), what="known bad")
        wait_for(lambda: events(state, "ready"), what="ready alone")
        stop(proc)
    launches = fleet.launches()[2:]
    assert "--disable-cuda-graph" in launches[0]
    assert launches[1] == fleet.argv(server.port)  # the user's own line, as alone
    assert "--attention-backend" not in launches[2]
    assert len(launches) == 3
    marked = events(state, "fleet.known_bad")[0]
    assert marked["status"] == "known_bad"
    now = core.decode_entry(store.get(key) or b"", key)
    # Learning alone afterwards replaced the known-bad entry with the fix that held.
    assert now.status == "proven" and now.edits == entry.edits


def test_store_down_at_start_the_guard_learns_alone(fleet: Fleet, run_guard: Guard) -> None:
    if fleet.url.startswith("etcd"):
        fleet.etcd.stop()  # type: ignore[attr-defined]
    else:
        Path(fleet.url[7:]).mkdir(mode=0o700)
        Path(fleet.url[7:]).chmod(0o777)  # others could write it: refused as a store
    with HealthServer() as server:
        state = fleet.tmp / "state-f"
        proc = run_guard(fleet.config("f"), fleet.argv(server.port), state_dir=state)
        wait_for(lambda: events(state, "ready"), what="ready alone")
        wait_for(lambda: events(state, "fleet.error"), what="publish failed")
        stop(proc)
    assert [r["result"] for r in events(state, "fleet.lookup")] == ["error"]
    assert len(fleet.launches()) == 2


def test_store_that_never_answers_is_skipped_within_the_bound(tmp_path: Path,
                                                             run_guard: Guard) -> None:
    with socket.socket() as hole:  # accepts connections, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        fleet = Fleet(tmp_path, f"etcd://127.0.0.1:{hole.getsockname()[1]}/x",
                      {"allow_unauthenticated": True})
        with HealthServer() as server:
            state = tmp_path / "state-g"
            proc = run_guard(fleet.config("g", timeout_s=0.5), fleet.argv(server.port),
                         state_dir=state)
            wait_for(lambda: events(state, "ready"), what="ready alone")
            stop(proc)
    lookup = events(state, "fleet.lookup")
    assert [r["result"] for r in lookup] == ["unavailable"]
    assert "no answer within 0.5s" in lookup[0]["reason"]


@pytest.mark.parametrize("fleet", ["etcd"], indirect=True)
def test_etcd_stopped_mid_run_changes_nothing_for_a_running_guard(
        fleet: Fleet, run_guard: Guard) -> None:
    with HealthServer() as server:
        learn_once(fleet, run_guard, server.port)
        state = fleet.tmp / "state-h"
        proc = run_guard(fleet.config("h"), fleet.argv(server.port), state_dir=state)
        wait_for(lambda: events(state, "fleet.confirmed"), what="confirmed")
        fleet.etcd.stop()  # type: ignore[attr-defined]
        assert proc.poll() is None
        stop(proc)
    assert len(fleet.launches()) == 3
    assert not events(state, "fleet.error")


def test_check_shows_the_fleet_fix_a_guard_would_launch_with(fleet: Fleet,
                                                             run_guard: Guard) -> None:
    with HealthServer() as server:
        learn_once(fleet, run_guard, server.port)
        argv = fleet.argv(server.port)
    cmd = [sys.executable, "-m", "sglang_guard", "check", "--config",
           str(fleet.config("check")), "--state-dir", str(fleet.tmp / "state-check")]
    text = subprocess.run([*cmd, "--", *argv], capture_output=True, text=True, timeout=120,
                          check=False)
    assert text.returncode == 1, text.stderr  # remediated: the fleet fix changes the line
    assert "fleet: lookup hit" in text.stdout
    assert "fleet: applies drop_flag --attention-backend fa3" in text.stdout
    doc = subprocess.run([*cmd, "--json", "--", *argv], capture_output=True, text=True,
                         timeout=120, check=False)
    shown = json.loads(doc.stdout)["fleet"]
    assert shown["applied"] and "--attention-backend" not in shown["argv_after"]
    assert "sekrit-9" not in json.dumps(shown)  # (check's own argv echo is the user's)
    assert len(fleet.launches()) == 2  # check launched nothing
