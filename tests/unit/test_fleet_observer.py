"""fleet/shell/fleet.py's decisions from journal records: scripted histories, an in-memory store."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from sglang_guard.config.guardconfig import LearnSection
from sglang_guard.fleet import fleet as core
from sglang_guard.fleet.shell.fleet import Fleet, FleetObserver, bounded
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise.events import CommandChanged, Event
from sglang_guard.supervise.machine import State
from sglang_guard.supervise.shell.observer import NO_OBSERVER
from support.records import typed

OPTIONS = load_option_table()
USER = ("--model-path", "/m", "--attention-backend", "fa3", "--port", "31000")
FIXED = ("--model-path", "/m", "--port", "31000")
LINE = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."


class Memory:
    """A store in a dict (the real ones are tested against etcd and a directory)."""

    where = "memory"

    def __init__(self, block: threading.Event | None = None) -> None:
        self.data: dict[str, bytes] = {}
        self.block = block

    def get(self, key: str) -> bytes | None:
        if self.block is not None:
            self.block.wait()
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def update(self, key: str, change: Any) -> bool:
        new = change(self.data.get(key))
        if new is None:
            return False
        self.data[key] = new
        return True

    def delete(self, key: str) -> bool:
        return self.data.pop(key, None) is not None

    def names(self) -> list[str]:
        return sorted(self.data)


def cl(argv: tuple[str, ...]):  # type: ignore[no-untyped-def]
    return parse_command_line(argv, OPTIONS)


def make(store: Memory, tmp_path: Path, **learn: Any) -> tuple[Fleet, list[dict[str, Any]]]:
    key = core.make_key(cl(USER), sglang="0.5.23", model_config="c" * 64, draft_config=None,
                        gpu_name=None, gpu_sm=90, packs=())
    f = Fleet(LearnSection(store="file:///unused", **learn), store, state_dir=str(tmp_path),
              key=key, options=OPTIONS, derived_dir=str(tmp_path / "derived"))
    records: list[dict[str, Any]] = []
    f.quiet = True
    return f, records


def proven(f: Fleet) -> core.Entry:
    return core.Entry(f.name, "proven", core.learned_edits(cl(USER), cl(FIXED)), ("fa3-sm",),
                      (LINE,), 1, core.Origin("other:1", "2026-12-01T00:00:00+00:00"))


def entry_of(store: Memory, f: Fleet) -> core.Entry:
    return core.decode_entry(store.data[f.name], f.name)


def run(obs: FleetObserver, *history: tuple[int, tuple[str, ...], dict[str, Any]]) -> None:
    for gen, argv, record in history:
        obs.stepped(State(cl=cl(argv), gen=gen, phase="starting"), None, [])  # type: ignore[arg-type]
        obs.record(typed(record))


def test_a_proven_entry_is_applied_as_a_fleet_remediation(tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path)
    store.put(f.name, proven(f).encode())
    out = f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    assert out.argv == FIXED
    assert [r["event"] for r in records] == ["fleet.lookup", "remediated"]
    assert records[1]["trigger"] == "fleet" and records[1]["origin"]["guard"] == "other:1"


def test_a_store_that_does_not_answer_is_skipped_within_the_bound(tmp_path: Path) -> None:
    never = threading.Event()
    store = Memory(block=never)
    f, records = make(store, tmp_path, timeout_s=0.05)
    out = f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    never.set()  # let the abandoned lookup thread end
    assert out.argv == USER
    assert records[0]["result"] == "unavailable"


def test_bounded_returns_the_exception_as_a_value() -> None:
    def boom() -> None:
        raise OSError("down")

    done, got = bounded(boom, 5.0)
    assert done and isinstance(got, OSError)


def test_ready_with_the_fleet_fix_adds_a_confirmation(tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path)
    store.put(f.name, proven(f).encode())
    f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, f)
    run(obs, (1, FIXED, {"event": "child.start", "gen": 1}),
        (1, FIXED, {"event": "ready", "gen": 1}))
    f.close(5)
    assert entry_of(store, f).confirmations == 1


def test_a_fleet_launch_that_ends_before_ready_is_known_bad_and_goes_back(tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path)
    store.put(f.name, proven(f).encode())
    f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, f)
    events: queue.Queue[Event] = queue.Queue()
    obs.start(events)
    run(obs, (1, FIXED, {"event": "child.exit", "gen": 1, "returncode": 1}))
    f.close(5)
    bad = entry_of(store, f)
    assert bad.status == "known_bad" and bad.failed_by == (f.guard,)
    changed = events.get_nowait()
    assert isinstance(changed, CommandChanged) and changed.cl.argv == USER
    # From here on it learns alone: its own fix that holds is published over the known-bad one.
    run(obs, (3, FIXED, {"event": "ready", "gen": 3}))
    f.close(5)
    assert entry_of(store, f).status == "known_bad"  # the same edits: skipped, not republished


def test_a_signal_during_the_fleet_launch_is_not_a_failure(tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path)
    store.put(f.name, proven(f).encode())
    f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, f)
    run(obs, (1, FIXED, {"event": "guard.signal", "signal": "SIGTERM"}),
        (1, FIXED, {"event": "child.exit", "gen": 1, "returncode": -15}))
    f.close(5)
    assert entry_of(store, f).status == "proven"


def test_learning_alone_publishes_what_reached_ready(tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path)
    f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, f)
    run(obs, (1, USER, {"event": "remediated", "trigger": "log", "rule": "fa3-sm", "line": LINE,
                        "gen": 1}),
        (2, FIXED, {"event": "ready", "gen": 2}))
    f.close(5)
    e = entry_of(store, f)
    assert e.status == "proven" and e.rules == ("fa3-sm",) and e.lines == (LINE,)
    assert e.launches == 1 and e.origin.guard == f.guard


def test_publish_off_writes_nothing(tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path, publish=False)
    f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, f)
    run(obs, (2, FIXED, {"event": "ready", "gen": 2}))
    f.close(5)
    assert store.data == {}


def test_a_give_up_after_own_fixes_is_published_known_bad_never_over_a_proven(
        tmp_path: Path) -> None:
    store = Memory()
    f, records = make(store, tmp_path)
    f.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, f)
    run(obs, (2, FIXED, {"event": "give_up", "reason": "crash loop"}))
    f.close(5)
    assert entry_of(store, f).status == "known_bad"

    store2 = Memory()
    g, records = make(store2, tmp_path, consume=False)
    store2.put(g.name, proven(g).encode())
    g.before_launch(cl(USER), [lambda event: records.append(event.to_record())])
    obs = FleetObserver(NO_OBSERVER, g)
    run(obs, (2, FIXED, {"event": "give_up", "reason": "crash loop"}))
    g.close(5)
    assert entry_of(store2, g).status == "proven"
