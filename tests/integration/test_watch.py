"""The file watcher, driven the way editors save files; waits on its events, never sleeps."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_guard.supervise.events import Event, FileChanged
from sglang_guard.supervise.shell.watch import FileWatcher

WAIT = 5.0


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[queue.Queue[Event], Path, Path]]:
    cfg = tmp_path / "guard.toml"
    yml = tmp_path / "sglang.yaml"
    cfg.write_text("a = 1\n")
    yml.write_text("port: 1\n")
    events: queue.Queue[Event] = queue.Queue()
    watcher = FileWatcher(events, {str(cfg): "guard_config", str(yml): "sglang_yaml"},
                          debounce=0.2)
    watcher.start()
    yield events, cfg, yml
    watcher.stop()


def _next(events: queue.Queue[Event]) -> FileChanged:
    event = events.get(timeout=WAIT)
    assert isinstance(event, FileChanged)
    return event


def _quiet(events: queue.Queue[Event]) -> bool:
    try:
        events.get(timeout=1.0)
    except queue.Empty:
        return True
    return False


def test_write_in_place(watched: tuple[queue.Queue[Event], Path, Path]) -> None:
    events, cfg, _ = watched
    cfg.write_text("a = 2\n")
    assert _next(events) == FileChanged(str(cfg), "guard_config")
    assert _quiet(events)


def test_temp_file_renamed_over(watched: tuple[queue.Queue[Event], Path, Path]) -> None:
    events, _, yml = watched
    tmp = yml.with_name(".sglang.yaml.swp")
    tmp.write_text("port: 2\n")
    tmp.replace(yml)
    assert _next(events) == FileChanged(str(yml), "sglang_yaml")
    assert _quiet(events)


def test_delete_and_recreate_is_one_change(watched: tuple[queue.Queue[Event], Path, Path]) -> None:
    events, cfg, _ = watched
    cfg.unlink()
    cfg.write_text("a = 3\n")
    assert _next(events) == FileChanged(str(cfg), "guard_config")
    assert _quiet(events)


def test_a_burst_is_debounced_to_one_event(watched: tuple[queue.Queue[Event], Path, Path]) -> None:
    events, cfg, _ = watched
    for n in range(20):
        cfg.write_text(f"a = {n}\n")
    assert _next(events).path == str(cfg)
    assert _quiet(events)


def test_other_files_in_the_directory_are_ignored(
    watched: tuple[queue.Queue[Event], Path, Path],
) -> None:
    events, cfg, _ = watched
    (cfg.parent / "unrelated.txt").write_text("x")
    assert _quiet(events)


def test_deletion_alone_is_reported(watched: tuple[queue.Queue[Event], Path, Path]) -> None:
    events, _, yml = watched
    yml.unlink()
    assert _next(events) == FileChanged(str(yml), "sglang_yaml")


def test_reading_a_file_is_not_a_change(watched: tuple[queue.Queue[Event], Path, Path]) -> None:
    events, cfg, yml = watched
    assert cfg.read_text() and yml.read_bytes()  # what every reload does to these files
    assert _quiet(events)


def test_a_configmap_update_through_the_data_symlink_swap_is_a_change(tmp_path: Path) -> None:
    from support.kubelet import config_map, update_config_map  # noqa: PLC0415

    root = config_map(tmp_path / "etc", {"guard.toml": "a = 1\n", "rules.toml": "b = 1\n"})
    events: queue.Queue[Event] = queue.Queue()
    watcher = FileWatcher(events, {str(root / "guard.toml"): "guard_config"}, debounce=0.2)
    watcher.start()
    try:
        update_config_map(root, {"guard.toml": "a = 2\n", "rules.toml": "b = 1\n"})
        event = _next(events)
        assert (Path(event.path).name, event.kind) == ("guard.toml", "guard_config")
        assert (root / "guard.toml").read_text() == "a = 2\n"
        assert _quiet(events)
    finally:
        watcher.stop()


def test_writes_to_other_files_in_the_directory_are_not_even_delivered(
        watched: tuple[queue.Queue[Event], Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A log appended beside the config (kept open, as a redirect is) wakes nothing.

    Every path the handler is told about is recorded; inotify delivers in order, so once
    the config's own edit has come through, any event for the log would have come before.
    """
    events, cfg, _ = watched
    seen: list[str] = []
    real = FileWatcher.touched
    monkeypatch.setattr(FileWatcher, "touched",
                        lambda self, path: (seen.append(path), real(self, path))[1])
    log = cfg.with_name("out.log")
    with log.open("ab", buffering=0) as out:
        for _ in range(200):
            out.write(b"x" * 4096 + b"\n")
        (cfg.with_name("other.txt")).write_text("read me\n")
        (cfg.with_name("other.txt")).read_text()
        cfg.write_text("a = 3\n")
        assert _next(events) == FileChanged(str(cfg), "guard_config")
        others = [p for p in seen if not p.endswith(("guard.toml", "sglang.yaml"))]
        # the log's creation and other.txt's create/close come through, never 200 writes
        assert len(others) <= 4, others
        assert others.count(str(log.resolve())) <= 1
