"""Watch the guard config, the SGLang YAML and the rule packs; report settled changes.

Editors save in many ways (write in place, write a temp file and rename it over, delete and
recreate), often as a burst of events. The watcher observes each file's directory, filters
events for the watched names, and puts one `FileChanged` after the file has been quiet for
`debounce` seconds. Validation happens in the loop, never here.

A Kubernetes ConfigMap (or Secret) volume never touches the file itself: each key is a
symlink `guard.toml -> ..data/guard.toml`, and an update writes a new timestamped directory
and swaps the `..data` symlink to it (rename of `..data_tmp`). So an event on `..data` in a
watched file's directory counts as a change of every watched file there.

The kernel is asked (inotify's mask) only for what ends an edit or changes a name: a file
closed after writing, created, deleted, renamed. Not for each write or read: a log written
beside the config (a container's, the bench's output file) would otherwise wake the
watcher's thread for every chunk, ~0.05 CPU s per million lines passed through. Every
editor's save ends in one of these (a write in place is closed; a rename-over is a move).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from sglang_guard.supervise.events import Event, FileChanged

Kind = Literal["guard_config", "sglang_yaml", "rule_pack"]
DEBOUNCE_S = 0.3
_READS = frozenset({"opened", "closed_no_write"})
KUBELET_DATA = "..data"  # the symlink a ConfigMap volume swaps on every update
# What is asked of the kernel (see the module's docstring): IN_CLOSE_WRITE, IN_CREATE,
# IN_DELETE, IN_MOVED_FROM/TO (a swapped symlink, as a ConfigMap's `..data`, is a move).
EDITS: list[type[FileSystemEvent]] = [FileClosedEvent, FileCreatedEvent, FileDeletedEvent,
                                      FileMovedEvent, DirCreatedEvent, DirDeletedEvent,
                                      DirMovedEvent]


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: FileWatcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        # watchdog also reports reads (opened, closed_no_write): the guard reads these very
        # files on every reload, so counting reads as changes would reload forever.
        if event.event_type in _READS:
            return
        for attr in ("src_path", "dest_path"):
            raw = getattr(event, attr, "")
            if raw:
                path = Path(os.fsdecode(raw))
                # A deleted file cannot be resolved: resolve its directory instead.
                where = path.parent.resolve()
                if path.name == KUBELET_DATA:
                    self.watcher.swapped(str(where))
                else:
                    self.watcher.touched(str(where / path.name))


class FileWatcher:
    """Puts `FileChanged(path, kind)` on `events` once a watched file settles."""

    def __init__(self, events: queue.Queue[Event], files: Mapping[str, Kind],
                 debounce: float = DEBOUNCE_S) -> None:
        self.events = events
        self.debounce = debounce
        self.files: dict[str, Kind] = {}
        for path, kind in files.items():
            p = Path(path).expanduser().absolute()
            self.files[str(p.parent.resolve() / p.name)] = kind
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()
        self._observer: Any = Observer()

    def start(self) -> None:
        """Begin watching (one watch per directory)."""
        for directory in sorted({str(Path(p).parent) for p in self.files}):
            if Path(directory).is_dir():
                self._observer.schedule(_Handler(self), directory, recursive=False,
                                        event_filter=EDITS)
        self._observer.daemon = True
        self._observer.start()

    def stop(self) -> None:
        """Stop watching and cancel pending reports."""
        with self._lock:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
        self._observer.stop()
        self._observer.join(timeout=5)

    def touched(self, path: str) -> None:
        """An event for `path`: (re)start its quiet-period timer if it is watched."""
        kind = self.files.get(path)
        if kind is None:
            return
        with self._lock:
            old = self._timers.pop(path, None)
            if old is not None:
                old.cancel()
            timer = threading.Timer(self.debounce, self._settled, [path, kind])
            timer.daemon = True
            self._timers[path] = timer
            timer.start()

    def swapped(self, directory: str) -> None:
        """A ConfigMap volume's `..data` moved: every watched file in `directory` changed."""
        for path in [p for p in self.files if str(Path(p).parent) == directory]:
            self.touched(path)

    def _settled(self, path: str, kind: Kind) -> None:
        with self._lock:
            self._timers.pop(path, None)
        self.events.put(FileChanged(path, kind))
