"""The child shell with real processes: pass-through, line events, exits, parent death."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import itertools
import os
import queue
import random
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_guard.errors import InputError
from sglang_guard.rules.linereader import Hits, Line, LineReader, LiteralScan
from sglang_guard.rules.logline import LINE_CAP
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.supervise.events import ChildExited
from sglang_guard.supervise.shell import child as child_module
from sglang_guard.supervise.shell.child import TRIM_AFTER, WRITE_PIECE, Child
from sglang_guard.supervise.shell.supervisor import keeps
from support.children import FAKE, BlockingSink, HashSink, collect, fake_argv, next_line
from support.procs import survivors, wait_gone

MB = 1 << 20


def rand(size: int, seed: int) -> bytes:
    """The bytes the fake child's ["random", stream, size, seed] step writes."""
    return random.Random(seed).randbytes(size)  # noqa: S311


def check_lines(lines, stream, data):
    """Line events of `stream` tile `data` exactly: one per newline, plus an unterminated tail."""
    mine = [line for line in lines if line.stream == stream]
    assert len(mine) == data.count(b"\n") + (not data.endswith(b"\n"))
    assert sum(line.length for line in mine) + data.count(b"\n") == len(data)


def test_passthrough_is_byte_exact_and_in_order_per_stream(spawn, events):
    out, err = io.BytesIO(), io.BytesIO()
    child = spawn(
        ["print", "stdout", "start"],
        ["random", "stdout", 3 * MB, 1],
        ["hex", "stdout", "0a"],
        ["hex", "stderr", "00ff0a1b5b306d0a"],
        ["random", "stderr", 2 * MB, 2],
        ["print", "stdout", "end"],
        ["print", "stderr", "end"],
        stdout_sink=out,
        stderr_sink=err,
    )
    lines, exited = collect(events)
    assert child.join(20)
    want_out = b"start\n" + rand(3 * MB, 1) + b"\nend\n"
    want_err = bytes.fromhex("00ff0a1b5b306d0a") + rand(2 * MB, 2) + b"end\n"
    assert out.getvalue() == want_out
    assert err.getvalue() == want_err
    check_lines(lines, "stdout", want_out)
    check_lines(lines, "stderr", want_err)
    stdout_lines = [line for line in lines if line.stream == "stdout"]
    assert stdout_lines[0].text == "start"
    assert stdout_lines[-1].text == "end"
    assert exited == ChildExited(1, child.pid, 0)


class PieceSink(io.BytesIO):
    """A sink that records the size of every write."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, data: Any) -> int:
        self.sizes.append(len(data))
        return super().write(data)


def test_the_writer_cuts_large_chunks_into_write_pieces(spawn, events):
    # A flood is read READ_CHUNK at a time and written WRITE_PIECE at a time (child.py says
    # why): every write is at most a piece, the pieces are the bytes in order.
    out = PieceSink()
    child = spawn(["random", "stdout", 3 * MB, 3], stdout_sink=out)
    collect(events)
    assert child.join(20)
    assert out.getvalue() == rand(3 * MB, 3)
    assert max(out.sizes) == WRITE_PIECE
    assert sum(out.sizes) == 3 * MB


class WatchedSink(io.BytesIO):
    """A sink that says when it is first written to."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, data: Any) -> int:
        done = super().write(data)
        self.written.set()
        return done


def test_a_quiet_streams_chunk_goes_to_the_writer_after_its_lines(spawn, events):
    # The reader reads a quiet stream's chunk's lines itself and wakes its writer only then
    # (child.py: woken first, the writer took the GIL and the CPU beside an early stop's
    # SIGTERM). `keep` gives the writer its chance: it waits for the sink to be written.
    # Woken before the lines, the writer writes meanwhile; woken after, it cannot.
    sink = WatchedSink()
    seen: list[bool] = []

    def keep(_line: Line) -> bool:
        seen.append(sink.written.wait(0.3))
        return True

    child = spawn(["print", "stderr", "one quiet line"], stderr_sink=sink, keep=keep,
                  find=lambda block: Hits([len(block)]))
    lines, _ = collect(events)
    assert child.join(20)
    assert seen == [False]
    assert [line.text for line in lines] == ["one quiet line"]
    assert sink.getvalue() == b"one quiet line\n"


def test_a_quiet_chunk_its_scan_found_nothing_in_goes_to_the_writer_first(spawn, events):
    # The reader's scan found no line to read: nothing an early stop could come of, and the
    # writer is woken before the chunk's lines (the tracker's walk) and `on_chunk` run, as
    # a flood's chunk's is. `on_chunk` waits for the sink: woken first, the writer writes.
    sink = WatchedSink()
    seen: list[bool] = []

    def on_chunk(_stream: str, _chunk: bytes) -> None:
        seen.append(sink.written.wait(20))

    child = spawn(["print", "stderr", "a line no rule reads"], stderr_sink=sink,
                  keep=lambda _line: True, find=lambda _block: Hits([]), on_chunk=on_chunk)
    lines, _ = collect(events)
    assert child.join(20)
    assert seen == [True] and lines == []
    assert sink.getvalue() == b"a line no rule reads\n"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_chunk_whose_lines_fail_is_still_written(spawn, events):
    # The reader's own line reading raises (a bug): the chunk's bytes still reach the sink
    # before the reader ends; the exit still comes.
    sink = io.BytesIO()

    def keep(_line: Line) -> bool:
        raise RuntimeError("a bug in keep")

    child = spawn(["print", "stderr", "a line"], stderr_sink=sink, keep=keep,
                  find=lambda block: Hits([len(block)]))
    _, exited = collect(events)
    assert child.join(20)
    assert exited.returncode == 0
    assert sink.getvalue() == b"a line\n"


def test_a_file_sink_is_written_in_c_after_what_it_held(spawn, events, tmp_path, monkeypatch):
    # The guard's own stdout is a plain file object: the writer writes its descriptor in C
    # (linescan.write_pieces, WRITE_PIECE bytes per write), the sink flushed first, so what
    # was written to it before comes out before; the file holds every byte in order.
    calls: list[tuple[int, int]] = []
    real = child_module.write_pieces
    if real is None:
        pytest.skip("the C line search is not built here")

    def counted(fd: int, data: bytes, piece: int) -> int:
        calls.append((fd, piece))
        return real(fd, data, piece)

    monkeypatch.setattr(child_module, "write_pieces", counted)
    path = tmp_path / "out.log"
    with path.open("wb") as out:
        out.write(b"held in the buffer\n")
        child = spawn(["random", "stdout", 3 * MB, 3], stdout_sink=out)
        collect(events)
        assert child.join(20)
        assert calls
        assert set(calls) == {(out.fileno(), WRITE_PIECE)}
    assert path.read_bytes() == b"held in the buffer\n" + rand(3 * MB, 3)


@pytest.mark.parametrize("on_reader", ["yes", "no", "literal", "stale"],
                         ids=["reader-scans", "scanner-scans", "read-scan", "read-scan-stale"])
def test_a_scanned_stream_yields_the_same_lines_whichever_thread_scans(events, tmp_path,
                                                                       on_reader):
    # `scan_on_reader`: the reader scans a chunk before handing it on (a scan without the
    # GIL per hit), or the thread that reads its lines does, or the reader scans in the
    # read's own call (a LiteralScan: linescan.read_scan): the same lines either way. "stale":
    # the literal scan handed out before each read is never the one handed out after it (as
    # across a reload), and finds nothing: the chunk is scanned again as `find` stands.
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    literal = matcher.literal_scan(False)
    if on_reader in ("literal", "stale") and literal is None:
        pytest.skip("the running set is not searched as literals in C here")
    blind = [LiteralScan(literal.needles, lambda _: Hits(())) for _ in range(2)] if literal else []
    turns = itertools.count()
    answers = {"yes": lambda: True, "no": lambda: False, "literal": lambda: literal,
               "stale": lambda: blind[next(turns) % 2]}

    def find(block: bytes) -> Hits:
        return matcher.line_scan(block, False)

    def keep(line: Line) -> bool:
        return keeps(matcher, line)

    filler = b"".join(b"[2026-12-06 05:00:00] Decode batch. #running-req: %d\n" % i
                      for i in range(12000))
    data = (filler + b"\x1b[31m[2026-12-06 05:00:01] Scheduler hit an exception: boom\x1b[0m\n"
            + b"Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: x\n"
            + filler + b"[2026-12-06 05:00:02] Scheduler hit an exception: again\n")
    want = LineReader(LINE_CAP, find, keep).feed(data)
    assert len(want) == 2
    source = tmp_path / "out.bin"
    source.write_bytes(data)
    write = f"import sys; sys.stdout.buffer.write(open({str(source)!r}, 'rb').read())"
    child = Child.spawn([sys.executable, "-c", write], gen=1, events=events,
                        stdout_sink=io.BytesIO(), stderr_sink=io.BytesIO(), find=find,
                        keep=keep, warm=matcher.warm_thread,
                        scan_on_reader=answers[on_reader])
    try:
        lines, _ = collect(events)
        assert child.join(20)
    finally:
        child.stop(0.0, timeout=10)
    assert [line.text for line in lines if line.stream == "stdout"] == [w.text for w in want]


def test_a_100_mb_line_passes_whole_and_is_matched_on_its_head(spawn, events):
    size, sink = 100_000_000, HashSink()
    child = spawn(["fill", "stdout", size, "x"], stdout_sink=sink, line_cap=1024)
    lines, exited = collect(events, timeout=60)
    assert child.join(20)
    assert exited.returncode == 0
    assert [(line.stream, line.text, line.length) for line in lines] == [
        ("stdout", "x" * 1024, size)
    ]
    want = hashlib.sha256()
    block = b"x" * MB
    for start in range(0, size, MB):
        want.update(block[: min(MB, size - start)])
    assert (sink.size, sink.sha.hexdigest()) == (size, want.hexdigest())


def test_a_long_line_keeps_its_head_and_the_next_line_is_whole(spawn, events):
    out = io.BytesIO()
    child = spawn(
        ["fill", "stdout", 5000, "a"],
        ["hex", "stdout", "0a"],
        ["print", "stdout", "next"],
        stdout_sink=out,
        line_cap=100,
    )
    lines, _ = collect(events)
    assert [(line.text, line.length) for line in lines] == [("a" * 100, 5000), ("next", 4)]
    assert child.join(20)  # ChildExited may come before the writer wrote the last chunk
    assert out.getvalue() == b"a" * 5000 + b"\nnext\n"


def test_text_is_cleaned_but_the_bytes_pass_through_unchanged(spawn, events):
    raw = b"\x1b[31mERROR\x1b[0m: bad \xff\xfe byte\x00 here\r\n"
    out = io.BytesIO()
    child = spawn(["hex", "stdout", raw.hex()], stdout_sink=out)
    lines, _ = collect(events)
    assert child.join(20)
    assert [(line.text, line.length) for line in lines] == [
        ("ERROR: bad \ufffd\ufffd byte here", len(raw) - 1)
    ]
    assert out.getvalue() == raw


def test_a_last_line_without_newline_is_still_emitted(spawn, events):
    spawn(
        ["print", "stdout", "one"],
        ["hex", "stdout", b"tail".hex()],
        ["hex", "stderr", b"err-tail".hex()],
    )
    lines, _ = collect(events)
    assert sorted((line.stream, line.text) for line in lines) == [
        ("stderr", "err-tail"),
        ("stdout", "one"),
        ("stdout", "tail"),
    ]


def test_the_exit_event_carries_the_last_exception_line_that_ended_a_traceback(spawn, events):
    """The machine compares two launches' crash lines (give_up_on_repeat): the reader keeps
    the last exception line that ended a traceback and the exit event carries it."""
    spawn(
        ["print", "stderr", "Traceback (most recent call last):"],
        ["print", "stderr", '  File "a.py", line 1, in f'],
        ["print", "stderr", "ValueError: the first crash"],
        ["print", "stderr", "[2026-01-01 00:00:00] still printing"],
        ["print", "stderr", "Traceback (most recent call last):"],
        ["print", "stderr", "KeyError: 'the second'"],
        ["print", "stderr", "ValueError: in the message, not an end of frames"],
    )
    _, exited = collect(events)
    assert exited.exception_line == "KeyError: 'the second'"


def test_no_traceback_no_exception_line(spawn, events):
    spawn(["print", "stdout", "ValueError: not after a traceback's frames"])
    _, exited = collect(events)
    assert exited.exception_line is None


def drained(child: Child, timeout: float | None) -> bool:
    """Every byte the child's readers took was written to the sinks (False on timeout)."""
    # the pumps' own byte counts are what the test reads
    return all(pump.drained(timeout) for pump in child._pumps)


def test_a_blocked_sink_does_not_stall_the_child(spawn, events):
    sink = BlockingSink()
    child = spawn(["random", "stdout", 4 * MB, 3], ["print", "stderr", "done"], stdout_sink=sink)
    try:
        # The sink has not accepted a byte, yet the child wrote 4 MB (64 pipe-fulls) and exited.
        _, exited = collect(events)
        assert exited.returncode == 0
        assert sink.entered.is_set()
        assert sink.getvalue() == b""
        assert not drained(child, 0)
    finally:
        sink.release.set()
    assert drained(child, 20)
    assert sink.getvalue() == rand(4 * MB, 3)
    assert child.join(20)


def test_past_the_byte_budget_the_reader_holds_the_child(spawn, events):
    sink = BlockingSink()
    child = spawn(["random", "stdout", 4 * MB, 4], stdout_sink=sink, byte_budget=256 * 1024)
    try:
        with pytest.raises(queue.Empty):
            collect(events, timeout=1.0)  # documented: the child blocks in write()
        assert child.poll() is None
    finally:
        sink.release.set()
    _, exited = collect(events)
    assert exited.returncode == 0
    assert child.join(20)
    assert sink.getvalue() == rand(4 * MB, 4)


class Trims:
    """A `trim` that counts its calls, per writer thread (the real one hands pages back)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.called = threading.Event()

    def __call__(self) -> None:
        self.calls.append(threading.current_thread().name)
        self.called.set()


def test_a_written_backlog_is_handed_back_once_the_stream_is_quiet(spawn, events):
    """Past TRIM_AFTER bytes written, the writer trims the heap once it has written them all
    and waited TRIM_IDLE_S for more: glibc keeps a flood's chunks otherwise."""
    sink, trims = BlockingSink(), Trims()
    child = spawn(["random", "stdout", 12 * MB, 5], ["print", "stderr", "done"], ["pause"],
                  stdout_sink=sink, trim=trims)
    try:
        # The child wrote all 12 MB before this line: the reader holds them, unwritten.
        assert next_line(events, lambda line: line.stream == "stderr").text == "done"
        assert sink.entered.wait(20)
        assert not trims.called.is_set()  # nothing is written yet: no trim
    finally:
        sink.release.set()
    assert drained(child, 20)
    assert trims.called.wait(10)  # after TRIM_IDLE_S with nothing more to write
    assert trims.calls == ["child-1-stdout-writer"]  # once, by the stream that had the backlog
    assert sink.getvalue() == rand(12 * MB, 5)


def test_a_flood_the_writer_keeps_up_with_is_handed_back_too(spawn, events):
    """A flood that never builds a backlog (bursts a fast sink takes at once) still churned
    the heap: past TRIM_AFTER bytes written the quiet stream is trimmed, once. (The rule
    before counted the backlog's peak, which stays one burst here, and never trimmed: a
    16-core device host kept ~2.7 MiB after a start-up flood; bench/README.md.)"""
    burst = TRIM_AFTER // 8
    steps = [step for i in range(16)
             for step in (["random", "stdout", burst, 10 + i], ["sleep", 0.02])]
    sink, trims = io.BytesIO(), Trims()
    child = spawn(*steps, ["print", "stderr", "done"], ["pause"], stdout_sink=sink, trim=trims)
    assert next_line(events, lambda line: line.stream == "stderr").text == "done"
    assert drained(child, 20)
    assert trims.called.wait(10)  # after TRIM_IDLE_S with nothing more to write
    assert trims.calls == ["child-1-stdout-writer"]
    assert sink.getvalue() == b"".join(rand(burst, 10 + i) for i in range(16))


def test_a_stream_under_the_threshold_is_not_trimmed(spawn, events):
    sink, trims = BlockingSink(), Trims()
    child = spawn(["random", "stdout", TRIM_AFTER // 2, 6], stdout_sink=sink, trim=trims)
    try:
        _, exited = collect(events)  # the child wrote 2 MB into the backlog and exited
        assert exited.returncode == 0
    finally:
        sink.release.set()
    assert child.join(20)  # every writer finished: it would have trimmed by now
    assert trims.calls == []
    assert sink.getvalue() == rand(TRIM_AFTER // 2, 6)


def test_a_stream_that_ends_right_after_its_backlog_is_trimmed_at_its_end(spawn, events):
    sink, trims = BlockingSink(), Trims()
    child = spawn(["random", "stdout", 12 * MB, 7], stdout_sink=sink, trim=trims)
    try:
        _, exited = collect(events)
        assert exited.returncode == 0
    finally:
        sink.release.set()
    assert child.join(20)
    assert trims.calls == ["child-1-stdout-writer"]


@pytest.mark.parametrize(
    ("steps", "returncode"),
    [
        ([["print", "stdout", "x"]], 0),
        ([["exit", 3]], 3),
        ([["kill", int(signal.SIGKILL)]], -signal.SIGKILL),
        ([["kill", int(signal.SIGSEGV)]], -signal.SIGSEGV),
    ],
)
def test_exit_codes_and_signals(spawn, events, steps, returncode):
    child = spawn(*steps, gen=7)
    _, exited = collect(events)
    assert exited == ChildExited(7, child.pid, returncode)
    assert child.join(10)
    assert child.poll() == returncode


def test_exactly_one_exit_event_after_every_line_and_no_zombie(spawn, events):
    streams = ("stdout", "stderr")
    steps = [["print", stream, f"{stream} {i}"] for i in range(200) for stream in streams]
    child = spawn(*steps, ["exit", 5])
    lines, exited = collect(events)
    assert child.join(10)
    assert events.empty()  # nothing after the exit event
    assert exited.returncode == 5
    for stream in ("stdout", "stderr"):
        assert [line.text for line in lines if line.stream == stream] == [
            f"{stream} {i}" for i in range(200)
        ]
    with pytest.raises(psutil.NoSuchProcess):  # reaped: not even a zombie is left
        psutil.Process(child.pid)
    assert all(p.status() != psutil.STATUS_ZOMBIE for p in psutil.Process().children())


def test_stop_lets_a_cooperative_child_finish(spawn, events):
    child = spawn(
        ["print", "stdout", "ready"], ["wait_term"], ["print", "stdout", "bye"], ["exit", 0]
    )
    next_line(events, lambda line: line.text == "ready")
    report = child.stop(grace=10)
    assert (report.terminated, report.killed, survivors(child.pgid)) == (1, 0, 0)
    lines, exited = collect(events)
    assert [line.text for line in lines] == ["bye"]
    assert exited.returncode == 0


def test_the_child_runs_in_its_own_session_with_stdin_from_devnull(spawn, events):
    child = spawn(["print", "stdout", "ready"], ["pause"])
    next_line(events, lambda line: line.text == "ready")
    assert os.getsid(child.pid) == child.pid == os.getpgid(child.pid) == child.pgid
    assert str(Path(f"/proc/{child.pid}/fd/0").readlink()) == os.devnull
    child.stop(grace=5)
    collect(events)


def test_a_missing_program_is_an_input_error(events):
    with pytest.raises(InputError, match="no-such-program"):
        Child.spawn(
            ["/no-such-program"],
            gen=1,
            events=events,
            stdout_sink=io.BytesIO(),
            stderr_sink=io.BytesIO(),
        )


def test_a_bounded_event_queue_is_refused():
    with pytest.raises(ValueError, match="unbounded"):
        Child.spawn(
            fake_argv(),
            gen=1,
            events=queue.Queue(maxsize=10),
            stdout_sink=io.BytesIO(),
            stderr_sink=io.BytesIO(),
        )


def test_the_child_dies_with_a_sigkilled_guard():
    """A guard spawns a child from its main thread; SIGKILL the guard: the kernel kills the child.

    The child is in its own session, so nothing but PR_SET_PDEATHSIG reaches it.
    """
    script = fake_argv(["print", "stdout", "ready"], ["pause"])[-1]
    guard = subprocess.Popen(
        [sys.executable, str(FAKE), "--guard", script],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    child_pid = None
    try:
        assert guard.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(guard.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=30), "the fake guard never reported its child"
        words = guard.stdout.readline().split()
        assert words[0] == b"child" and words[2] == b"ready"
        child_pid = int(words[1])
        assert os.getsid(child_pid) != os.getsid(guard.pid)
        guard.kill()
        assert guard.wait(10) == -signal.SIGKILL
        assert wait_gone([child_pid], timeout=10) == []
    finally:
        guard.kill()
        guard.wait(10)
        if child_pid is not None and wait_gone([child_pid], timeout=0):
            os.kill(child_pid, signal.SIGKILL)


def _thread_names() -> set[str]:
    names = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            names.add((task / "comm").read_text().strip())
    return names


def test_the_pump_threads_carry_their_launch_stream_and_role(spawn, events):
    # `top -H` and py-spy then say which thread takes the CPU in a flood (the scanner, on the
    # 16-core host: bench/README.md). Each thread names itself first thing; the readers have
    # read (a line each) and the writers written (the sinks entered) before the names are read.
    sinks = (BlockingSink(), BlockingSink())
    for sink in sinks:
        sink.release.set()
    child = spawn(["print", "stdout", "out"], ["print", "stderr", "err"], ["wait_term"], gen=5,
                  stdout_sink=sinks[0], stderr_sink=sinks[1])
    seen = {next_line(events, lambda _: True).text for _ in range(2)}
    assert seen == {"out", "err"}
    assert all(sink.entered.wait(10) for sink in sinks)
    want = {f"g5-{stream}-{role}" for stream in ("stdout", "stderr")
            for role in ("read", "scan", "write")} | {"g5-reaper"}
    deadline = time.monotonic() + 10  # the scanners and the reaper: started, maybe not yet run
    while not want <= (names := _thread_names()) and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert want <= names, sorted(names)
    child.stop(2.0)


_F_GETPIPE_SZ = 1032  # <linux/fcntl.h>


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 16])
def test_the_pipes_are_as_wide_as_the_cores_allow(spawn, events, monkeypatch, cores):
    # One read's worth where the child and the pumps share few cores, two reads' where each
    # can have its own (child.py says why). Read from the child's side of the pipes, after
    # each reader has read a line (it sizes its pipe before its first read).
    monkeypatch.setattr(child_module, "_cores", lambda: cores)
    child = spawn(["print", "stdout", "out"], ["print", "stderr", "err"], ["wait_term"])
    assert {next_line(events, lambda _: True).text for _ in range(2)} == {"out", "err"}
    want = child_module.READ_CHUNK * (2 if cores >= 4 else 1)
    for fd in (1, 2):
        pipe = os.open(f"/proc/{child.pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
        try:
            assert fcntl.fcntl(pipe, _F_GETPIPE_SZ) == want
        finally:
            os.close(pipe)
    child.stop(2.0)
