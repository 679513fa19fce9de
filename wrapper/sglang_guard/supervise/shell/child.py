"""The SGLang child: spawned in its own session, its output pumped, its exit reported.

Threads per launch (all daemons; they put events and decide nothing, except that a reader
or scanner whose lines the caught-up loop will stop the child for sends the SIGTERM itself,
first: the early stop, `Child._put_lines`):
- one reader per pipe, on a short time slice while its child writes little, until the guard
  signals the child (READER_SLICE_NS): reads bytes (READ_CHUNK at a time), scans each chunk
  where the scan takes no GIL per hit (`scan_on_reader`; LineReader.scan: past the start,
  the running phase's literals in C; and the lines with an ESC or NUL) and hands it, with
  what the scan found, to its writer and its scanner. A scan on Hyperscan, which takes the
  GIL for a Python call per hit (while starting), is slower on the reader and is left to the
  scanner (bench/README.md, "The log path, fifth round"; a start-up flood of near-miss lines
  ran 18% slower there, 2 cores); with the C scan, measured alternated on a 16-core device
  host (4M lines, 5 runs an arm), the log mix went from 8.99M to 9.69M lines/s and the
  near-miss mix from 6.44M to 6.93M, the scanner then only reading lines; on 2 cores no
  change beyond the spread (bench/README.md, "The log path, tenth round"). That C scan runs
  in the read's own call (`_next`, linescan.read_scan: the GIL let go once for both);
- one writer per pipe: copies the chunks, byte-exact and in order, to the guard's own sink
  (WRITE_PIECE bytes per write; to a plain file's descriptor in C, the GIL released over a
  whole chunk's writes: `_put_out`);
- one scanner per pipe (named "scan"): reads each chunk's lines, scanning it first where the
  reader did not (rules/linereader.py: with a scan, only the lines a hit ends in are read),
  at most SCAN_BEHIND chunks behind the reader, which waits for it past that (the child then
  waits in `write`). When the scanner has read every chunk handed to it and a read came back
  short of READ_CHUNK (the pipe drained: the child is not ahead), the reader reads that
  chunk's lines itself, in the same order: a quiet stream's fatal line then costs no
  hand-off between threads (measured: ~0.1-0.2 ms of the idle reaction), and where that
  chunk has lines to read it hands it to its writer only after them (and an early stop's
  SIGTERM): woken first, the writer took the GIL whenever the reader let it go (the
  scan's Hyperscan call, the tree walk's reads) and the CPU beside it (bench/README.md,
  "The idle reaction, the child's end"). A chunk whose scan on the reader found nothing
  to read goes to the writer first (`_scanned_blank`);
- one reaper: `Popen.wait` (so no zombie; its return also ends `wait_early_end`, and the
  readers' wait at EOF for a child the guard stopped: `_let_end`), then
  waits for both readers' EOF, then puts the single `ChildExited` -- every `ChildLine` of a
  launch is on the queue before it, and it carries the last exception line either stream's
  reader read (LineReader.last_exception).

`on_chunk(stream, chunk)`, if given, sees every chunk once its lines are read (the stall
watch's progress evidence, at most SCAN_BEHIND chunks late): the scanner calls it after the
chunk's `ChildLine`s are put, so the loop's step for a fatal line does not wait behind the
progress event's (measured: ~0.3-0.5 ms of the idle reaction, the two threads taking turns
at the GIL); it must be cheap and never block.

A line longer than the cap is passed through whole but only its head is kept for matching;
`ChildLine.length` counts the whole line's bytes, without its newline.

The reader never waits on the event consumer (the queue must be unbounded) nor on a slow
sink, except past BYTE_BUDGET bytes not yet written: then it stops reading, the pipe fills
and the child blocks in `write`. That bounds the guard's memory on a sink that never drains.
What a burst of output took is handed back once it is written: when a stream's writer has
written TRIM_AFTER bytes or more since it last trimmed and then waited TRIM_IDLE_S for the
next chunk, it calls `trim` (common/shell/heap.trim_heap, glibc's malloc_trim). glibc keeps
the freed chunks otherwise: after a 200 MB start-up flood to a file the guard's steady RSS
stayed at 50-145 MiB against 34 without one (bench/README.md, "Memory after a flood"), and
untrimmed after a flood the writer kept up with ~2.5-2.8 MiB above idle, the heap's top held
under glibc's own trim threshold (a writer that keeps up builds no backlog, which the rule
before waited for; a 16-core device host, most likely so, kept 2.7: bench/README.md, "A full
run of the landed main"). A stream that is never quiet that long is not trimmed (its next
burst would fault the pages in again).

The scanner's work per chunk is the lines the scan hit; a chunk with no hit costs no
per-line work, and a fatal line costs the lines it is in, not its chunk.

If a descendant keeps the pipes open after the main process died, EOF -- and so
`ChildExited` -- waits for it; `stop()` kills the whole tree and so closes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import io
import itertools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, BinaryIO

from sglang_guard.common.shell.cores import usable_cores
from sglang_guard.common.shell.heap import trim_heap
from sglang_guard.common.shell.threadname import name_this_thread
from sglang_guard.common.shell.timeslice import SHORTEST_NS, set_slice
from sglang_guard.errors import InputError
from sglang_guard.rules.linereader import Find, Hits, Line, LineReader, LiteralScan
from sglang_guard.rules.linescan import read_scan, write_pieces
from sglang_guard.rules.logline import LINE_CAP
from sglang_guard.rules.quick import Quick
from sglang_guard.supervise.events import ChildExited, ChildLine, Event, Stream
from sglang_guard.supervise.shell.eventqueue import EventQueue
from sglang_guard.supervise.shell.proctree import (
    Stopping,
    StopReport,
    finish_stop,
    terminate_tree,
)

# Bytes per read: each chunk's buffer stays warm in the cache and the scanner close behind.
# Each chunk also costs the pump threads a fixed share of Python (the reader's hand-offs,
# the scanner's line reading: ~20 us a chunk, more with the threads sharing two cores), so
# fewer, larger reads cost less CPU. Measured alternated (bench/README.md, "The log path,
# fourteenth round"): 512 KiB instead of 256 KiB took the guard's CPU per million lines on 2
# cores from 0.23 to 0.20 (near-miss mix; the log mix level) and on a 16-core device host
# from 0.185 to 0.174 (log) and 0.189 to 0.176 (near-miss); the fatal line inside a stdout
# flood reached SIGTERM in 1.4-2.1 ms against 1.8-2.5 (2 cores) and 1.6-1.7 against
# 1.6-1.75 (16 cores); the steady RSS after a 200 MB start-up flood rose 0.3 MiB
# (34.2-34.4 -> 34.0-34.6). Before that (bench/README.md, "Reaction, third round"), with
# the pipe as wide as a read: the fatal line inside a stdout flood reached SIGTERM in ~4.8
# -> 3.2 ms (H200 host) and ~5.6 -> 3.3-4.4 ms (2 cores) with 256 KiB instead of 1 MiB.
READ_CHUNK = 512 * 1024
# The pipe's capacity (F_SETPIPE_SZ, where Linux lets us), by the cores the guard may use
# (common/shell/cores.py). What the pipe holds is what a fatal line written into a flood
# waits behind, and what the child may write while the reader scans. Where the child, the
# reader, the scanner and the writer can each have a core (WIDE_PIPE_CORES or more), a pipe
# of two reads lets the child write on while the reader scans: measured alternated on a
# 16-core device host (4M lines, 4 runs an arm, 512 KiB reads), 0.99x -> 1.09x supervisord
# (log mix) and 1.01x -> 1.15x (near-miss), the fatal line in a flood 1.6-1.7 -> 2.2-2.4
# ms (the floor's: 0.8-1.3). On 2 cores the same pipe only lets the child take the core the
# pumps need: 0.93x -> 0.84x (log), 0.82x -> 0.83x (near-miss), CPU per million lines 0.22
# -> 0.235 (log): there the pipe holds one read.
WIDE_PIPE = 2 * READ_CHUNK
WIDE_PIPE_CORES = 4


def pipe_size(cores: int) -> int:
    """The capacity the pumps give a pipe where the guard may use `cores` cores at once."""
    return WIDE_PIPE if cores >= WIDE_PIPE_CORES else READ_CHUNK


SCAN_BEHIND = 4  # chunks the scanner may be behind the reader
# Bytes per write to the sink. A file's page cache takes a write in folios as large as the
# write (Linux 6.x large folios): a 256 KiB write asks the page allocator for 256 KiB at once,
# 32 KiB writes for pages it keeps at hand. On a VM that hands free memory back to its host
# (virtio-balloon free page reporting, as on the bench's Firecracker VMs) the large ones are
# fresh host pages: writing the same 195 MB in 256 KiB writes took 0.75-1.17 s of kernel
# time, in 32 KiB writes 0.06 (one run of four 1.1), in 8 KiB 0.10. The guard's writer
# then fell behind, and its backlog took fresh memory too: 5 runs alternated, log mix 1M,
# 1,694 -> 5,662 k lines/s and 0.54 -> 0.10 kernel CPU s per 1M lines, peak RSS 60-144 ->
# 38-52 MiB (bench/README.md, "The writer's write size"). Where no freed memory had gone back
# (a 16-core device host), 32 KiB writes cost 0.01-0.02 s more per 195 MB than 256 KiB ones
# (bench/h200/h100-host-write-size.txt).
WRITE_PIECE = 32 * 1024
_F_SETPIPE_SZ = 1031  # <linux/fcntl.h>
PIPE_GRACE_S = 10.0  # after the main process exits, how long its pipes may stay open
# Once the guard sent a child its SIGTERM, the longest the guard's own work that would run
# beside the dying main process waits for its end: the loop's step of an early stop's lines
# (Child.wait_early_end, asked by supervise/shell/supervisor.py) and a reader's end at EOF
# (Child._let_end). Measured on 2 cores: the bench's one-process child ends ~1.1 ms after its
# SIGTERM; the step beside it cost that end ~0.1 ms (bench/README.md, "The idle reaction: the
# loop lets the early stop's child end first"), the pump threads' ends 0.1-0.25 ms ("The idle
# reaction, the child's end"). A real SGLang tree takes longer to go: each then waits the
# whole 5 ms, once.
END_WAIT_S = 0.005
BYTE_BUDGET = 256 * 1024 * 1024  # bytes read but not yet written before the reader blocks
# The time slice each pipe's reader asks of the kernel while the child writes little and the
# guard has not signalled it (`_Pump._pace`; common/shell/timeslice.py: Linux 6.12+,
# elsewhere nothing changes). The child's write wakes its reader onto the child's own CPU,
# where with the default slice it waited for the child to block; SGLang's scheduler runs on
# after its fatal traceback (srt/managers/scheduler.py:6372-6373 on 0.5.23: it logs it, then
# signals its parent and exits). Measured on 2 cores, alternated (bench/README.md, "The idle
# reaction: the reader's slice"): a child that computes on after its fatal line (the bench's
# `runs-on`) ended 2.42 -> 2.18 ms after it (q3 3.91 -> 2.46; 20 runs an arm; another
# window, 2.63 -> 2.24 and q3 4.11 -> 2.36), its SIGTERM sent 2.32 -> 1.03 ms after it; one
# that goes quiet (`idle`): 2.16 -> 2.17. A read of FLOOD_READ or more (a flood) puts the
# reader back on the default until one shorter than QUIET_READ: on the short slice
# throughout, the reader took the CPU at each of a flood's writes, and its reads were
# smaller and more (log mix, 1M lines, 8 runs an arm: 0.200 CPU s per million lines, 0.210
# throughout, 0.195 so paced). Once the guard sent the SIGTERM the readers go back to the
# default (`Child._calm_readers`): left short, their wake-ups took the CPU from the dying
# child (its end after the SIGTERM, 16 runs an arm: 1.56 -> 1.71 ms; put back: 1.58 ->
# 1.45).
READER_SLICE_NS = SHORTEST_NS
# The reader's slice follows its reads with a margin between two sizes, so that reads
# around one size do not switch it back and forth (each switch is three system calls): a
# read of FLOOD_READ or more (a flood's write, or more: the child ahead of the guard) puts
# it on the default slice, one shorter than QUIET_READ (a line or a few) back on the short
# one. On 2 cores a flood's first read of 64 KiB then lets the pipe fill, as f7157cf did.
# With one 64 KiB bound, a 16-core device host's reader, which drains the pipe at about
# each of a flood's 64 KiB writes, could switch at many of its ~9,000 reads per 4M lines (a
# switch costs ~5.6 us here). A same-host A/B found one bound, the margin and 0ea0087 within
# the spread there (bench/README.md, "The idle reaction: the reader's slice"); the margin
# costs nothing and bounds the switches.
FLOOD_READ = 64 * 1024
QUIET_READ = 4 * 1024
# Bytes written since the last trim past which a quiet stream is trimmed. Counted as written,
# not as the backlog's peak (the rule before): a flood the writer keeps up with never has a
# backlog of 1 MiB, and leaves the heap ~2.5-2.8 MiB above idle untrimmed all the same (here,
# with the trim switched off: 36.7-37.0 MiB after a 200 MB start-up flood against 34.2; a
# 16-core device host under the rule before: 38.8 against 36.1 idle). 1 MiB, two chunks;
# with a backlog threshold of 8 MiB some floods went untrimmed (8 runs alternated:
# 34.1-36.4 MiB against 34.2-34.8 with 1 MiB; bench/README.md, "The writer's write size").
TRIM_AFTER = 1024 * 1024
TRIM_IDLE_S = 1.0  # ... and the stream has been quiet this long
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _cores() -> int:
    """The cores the guard may use (read once: a process's affinity and quota are set
    before it starts)."""
    return usable_cores()


def _parent_death_hook() -> Callable[[], None] | None:
    """A `preexec_fn` making the kernel SIGKILL the child when the spawning thread exits."""
    if not sys.platform.startswith("linux"):
        return None
    # Resolved here, in the parent: between fork and exec another thread's locks may be held,
    # so the hook does as little as it can -- one foreign call with int arguments, no library
    # loading, no imports. (SGLang's own workers do the same prctl after they start:
    # srt/utils/common.py:3431 `kill_itself_when_parent_died`.)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent, kill = os.getpid(), int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the guard died between fork and prctl: too late to ask
            os.kill(os.getpid(), kill)

    return hook


class _Pump:
    """One pipe: a reader thread that cuts lines and a writer thread that copies bytes."""

    def __init__(
        self,
        *,
        pipe: IO[bytes],
        stream: Stream,
        gen: int,
        sink: BinaryIO,
        emit: Callable[[Stream, list[Line]], None],
        cap: int,
        budget: int,
        find: Find | None = None,
        keep: Callable[[Line], bool] | None = None,
        quick: Callable[[Hits], Quick | None] | None = None,
        on_chunk: Callable[[Stream, bytes], None] | None = None,
        ticket: Callable[[], int] | None = None,
        on_stage: Callable[[str], None] | None = None,
        warm: Callable[[], object] | None = None,
        trim: Callable[[], None] = trim_heap,
        scan_on_reader: Callable[[], LiteralScan | bool] | None = None,
        at_eof: Callable[[], None] | None = None,
    ) -> None:
        self._pipe, self._stream, self._sink, self._emit = pipe, stream, sink, emit
        self._at_eof = at_eof
        self._scan_on_reader = scan_on_reader
        self._gen = gen
        self._on_chunk, self._warm = on_chunk, warm
        self._budget = budget
        self._trim = trim
        # Where the stream is in a Python traceback starts "unknown" (rules/tracebacks.py):
        # before SGLang's first record nothing a client sent can be in it.
        self.lines = LineReader(cap, find, keep, ticket, on_stage, quick=quick)
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # The hand-offs are the C queues (a put or get takes no Python lock, nor a Condition's
        # Python code): the scanner's chunks, bounded by SCAN_BEHIND tokens in `_room` that
        # the reader takes per chunk handed and the scanner gives back as it takes one.
        self._scans: queue.SimpleQueue[tuple[bytes, Hits | None] | None] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(SCAN_BEHIND):
            self._room.put(None)
        # Bytes read and bytes written so far, each counted by one thread alone (the reader,
        # the writer): what is not yet written is their difference, read without a lock.
        # `_cond` is taken only to wait for the writer (the reader past the budget, `drained`):
        # `_waiters` counts such waits, and the writer notifies only while one is on.
        self._read_total = 0
        self._written = 0
        self._waiters = 0
        self._cond = threading.Condition()
        # Chunks handed to the scanner whose lines it has not read yet (under `_turn`): at
        # 0 the reader reads the next chunk's lines itself (`_read`).
        self._queued = 0
        self._turn = threading.Lock()
        self.sink_error: OSError | ValueError | None = None
        self.calm = False  # the guard signalled the child: the reader keeps the default slice
        self._short = False  # the reader's slice is READER_SLICE_NS (`_pace`)
        self._fd = _plain_fd(sink)
        self.reader = threading.Thread(target=self._read, name=f"child-{gen}-{stream}-reader")
        self.writer = threading.Thread(target=self._write, name=f"child-{gen}-{stream}-writer")
        self.scanner = threading.Thread(target=self._scan, name=f"child-{gen}-{stream}-scanner")
        self.reader.daemon = self.writer.daemon = self.scanner.daemon = True

    def start(self) -> None:
        """Start the threads."""
        self.writer.start()
        self.scanner.start()
        self.reader.start()

    def _named(self, role: str) -> None:
        # The kernel's name (15 bytes: "g1-stdout-scan"): `top -H` shows which one is busy.
        name_this_thread(f"g{self._gen}-{self._stream}-{role}")

    def _read(self) -> None:
        self._named("read")
        # the short slice while the child writes little (`_pace`); not at all where the
        # kernel keeps none, or where the guard has signalled the child already
        paced = self._short = not self.calm and set_slice(READER_SLICE_NS)
        if self._warm is not None:
            self._warm()
        fd = self._pipe.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, pipe_size(_cores()))
        try:
            while (read := self._next(fd)) is not None:
                chunk, hits = read
                if paced:
                    self._pace(len(chunk))
                if self._read_total - self._written >= self._budget:
                    self._wait_for_writer(lambda: self._read_total - self._written
                                          < self._budget)
                self._read_total += len(chunk)  # before the put: the writer's count is behind
                with self._turn:
                    # A short read: the pipe is drained, the child not ahead of the guard.
                    inline = self._queued == 0 and len(chunk) < READ_CHUNK
                    if not inline:
                        self._queued += 1
                if inline and _scanned_blank(hits):  # no line to read: the writer first
                    self._chunks.put(chunk)
                    self._lines_of(chunk, hits)
                elif inline:  # the scanner has read every chunk before: no hand-off, in order
                    try:  # the writer is woken after the lines (see the module's docstring)
                        self._lines_of(chunk, hits)
                    finally:
                        self._chunks.put(chunk)
                else:
                    self._chunks.put(chunk)
                    self._room.get()  # at most SCAN_BEHIND chunks queued for the scanner
                    self._scans.put((chunk, hits))  # its lines read there: the reader reads on
            if self._at_eof is not None:
                self._at_eof()
        finally:
            self._chunks.put(None)
            self._scans.put(None)
            self._pipe.close()

    def _pace(self, size: int) -> None:
        """The reader's slice for its next wait: READER_SLICE_NS after a read of less than
        QUIET_READ (the child writes little: its next line is read at once), the kernel's
        default after one of FLOOD_READ or more (a flood, whose reads then wait for the
        pipe to fill and are fewer) and once the guard signalled the child; as it was
        between the two. Asked of the kernel only when it changes."""
        if self.calm or size >= FLOOD_READ:
            short = False
        elif size < QUIET_READ:
            short = True
        else:
            return
        if short != self._short:
            self._short = short
            set_slice(READER_SLICE_NS if short else 0)

    def _next(self, fd: int) -> tuple[bytes, Hits | None] | None:
        """The next chunk (None at EOF) and, where the reader scans it, its scan's hits.

        Past the start in C, without the GIL (`scan_on_reader`, rules/linereader.py): a set
        of plain literals is searched in the read's own call (linescan.read_scan), the GIL
        let go once; a scan handed out before the read that is not the one handed out after
        it (a reload, the phase moved on while the read waited) is not used: the chunk is
        scanned again as the scan stands now. Else the chunk is read, then scanned here or,
        where the scan takes the GIL per hit, on the thread that reads its lines."""
        scan = self._reader_scans()
        if isinstance(scan, LiteralScan) and read_scan is not None:
            chunk, found = read_scan(fd, READ_CHUNK, scan.needles, 3, True)
            if not chunk:
                return None
            now = self._reader_scans()
            if now is scan:
                return chunk, None if found is None else scan.hits(found)
            scan = now
        else:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                return None
        return chunk, self.lines.scan(chunk) if scan else None

    def _reader_scans(self) -> LiteralScan | bool:
        """`scan_on_reader()`'s answer now (None given: the reader always scans)."""
        return True if self._scan_on_reader is None else self._scan_on_reader()

    def _scan(self) -> None:
        self._named("scan")
        if self._warm is not None:
            self._warm()
        while (handed := self._scans.get()) is not None:
            self._room.put(None)
            self._lines_of(*handed)
            with self._turn:
                self._queued -= 1
        self._put(self.lines.close())  # a last line without a newline still counts

    def _lines_of(self, chunk: bytes, hits: Hits | None) -> None:
        self._put(self.lines.feed(chunk, hits))
        if self._on_chunk is not None:  # after the chunk's lines: a fatal one goes first
            self._on_chunk(self._stream, chunk)

    def _put(self, lines: list[Line]) -> None:
        if lines:
            self._emit(self._stream, lines)

    def _write(self) -> None:
        self._named("write")
        since = 0  # bytes written since the last trim: past TRIM_AFTER, trim once quiet
        while True:
            try:  # the queue is in order: the wait runs out only with everything written
                chunk = self._chunks.get(timeout=TRIM_IDLE_S if since >= TRIM_AFTER else None)
            except queue.Empty:
                since = 0
                self._trim()
                continue
            if chunk is None:
                break
            size = len(chunk)
            if self.sink_error is None:
                try:
                    self._put_out(chunk)
                except (OSError, ValueError) as exc:  # closed or broken sink: keep draining
                    self.sink_error = exc
            del chunk  # not held over the wait below: the trim may hand its pages back
            self._written += size
            since += size
            if self._waiters:
                with self._cond:
                    self._cond.notify_all()
        if since >= TRIM_AFTER:  # the stream ended right after a burst
            self._trim()

    def _wait_for_writer(self, ready: Callable[[], bool], timeout: float | None = None
                         ) -> bool:
        """Wait until `ready()` (read over the two byte counts) holds after a write; False
        on timeout. The writer notifies after each chunk while a wait is on (`_waiters`,
        counted under `_cond` before `ready` is first asked: no write goes unseen)."""
        with self._cond:
            self._waiters += 1
            try:
                return self._cond.wait_for(ready, timeout)
            finally:
                self._waiters -= 1

    def drained(self, timeout: float | None = None) -> bool:
        """Whether every byte read was written, waiting up to `timeout` for it (tests)."""
        return self._wait_for_writer(lambda: self._read_total == self._written, timeout)

    def _put_out(self, chunk: bytes) -> None:
        """Write `chunk` to the sink, WRITE_PIECE bytes per write, and flush it.

        A plain file object's descriptor (`_fd`) is written in C (linescan.write_pieces),
        the GIL released over all of a chunk's writes, the sink flushed first (whatever was
        written to it before goes out before). In Python each write took the GIL back, and
        waited for it behind the threads reading lines; a non-blocking sink that fills up
        takes the rest as before."""
        if self._fd is not None and len(chunk) > WRITE_PIECE and write_pieces is not None:
            self._sink.flush()
            done = write_pieces(self._fd, chunk, WRITE_PIECE)
            if done == len(chunk):
                return
            chunk = chunk[done:]
        if len(chunk) <= WRITE_PIECE:
            self._sink.write(chunk)
        else:
            with memoryview(chunk) as view:
                for at in range(0, len(chunk), WRITE_PIECE):
                    self._sink.write(view[at:at + WRITE_PIECE])
        self._sink.flush()


def _scanned_blank(hits: Hits | None) -> bool:
    """Whether the reader's own scan found no line in a chunk to read (no rule's, no
    header's, none with an ESC or a NUL): its lines cost only the tracker's walk in C, and
    its writer is woken first, as a flood's is. None (not scanned on the reader: while
    starting) counts as lines to read."""
    return hits is not None and not (hits.lines or hits.headers or hits.dirty)


def _plain_fd(sink: BinaryIO) -> int | None:
    """The descriptor of a plain file object (the guard's own stdout and stderr), which the
    writer may write to directly; None for anything else (a test's sink, a closed file)
    and where the C is not built."""
    if write_pieces is None or type(sink) not in (io.BufferedWriter, io.FileIO):
        return None
    try:
        return sink.fileno()
    except (OSError, ValueError):
        return None


class Child:
    """One launch of the SGLang server (generation `gen`) and the threads that watch it."""

    def __init__(
        self,
        *,
        proc: subprocess.Popen[bytes],
        gen: int,
        events: queue.Queue[Event],
        sinks: tuple[BinaryIO, BinaryIO],
        cap: int,
        budget: int,
        find: Find | None = None,
        keep: Callable[[Line], bool] | None = None,
        quick: Callable[[Hits], Quick | None] | None = None,
        on_chunk: Callable[[Stream, bytes], None] | None = None,
        on_stage: Callable[[str], None] | None = None,
        warm: Callable[[], object] | None = None,
        trim: Callable[[], None] = trim_heap,
        stops_at: Callable[[Sequence[ChildLine]], bool] | None = None,
        scan_on_reader: Callable[[], LiteralScan | bool] | None = None,
    ) -> None:
        if proc.stdout is None or proc.stderr is None:
            raise ValueError("the child must be spawned with both pipes")
        self._proc, self.gen, self.pid = proc, gen, proc.pid
        self.pgid = proc.pid  # start_new_session: the child leads its own session and group
        self._events = events
        self._stops_at = stops_at
        # The early stop (`_put_lines`): the SIGTERM a reader sent, for the loop's
        # `terminate` to take; whether any terminate ran (then the reader sends none).
        self._stop_lock = threading.Lock()
        self._early: Stopping | None = None
        self._signalled = False
        self._early_unwaited = False  # an early stop `wait_early_end` has not waited on yet
        self._main_ended = threading.Event()  # the reaper's `Popen.wait` returned
        # One count for both streams: the exception line read last, on either, is the crash's.
        make = functools.partial(_Pump, gen=gen, emit=self._put_lines, cap=cap, budget=budget,
                                 find=find, keep=keep, quick=quick, on_chunk=on_chunk,
                                 scan_on_reader=scan_on_reader,
                                 ticket=itertools.count(1).__next__, on_stage=on_stage,
                                 warm=warm, trim=trim, at_eof=self._let_end)
        self._pumps = (
            make(pipe=proc.stdout, stream="stdout", sink=sinks[0]),
            make(pipe=proc.stderr, stream="stderr", sink=sinks[1]),
        )
        self._cap = cap
        self._reaper = threading.Thread(target=self._reap, name=f"child-{gen}-reaper")
        self._reaper.daemon = True
        for pump in self._pumps:
            pump.start()
        self._reaper.start()

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        gen: int,
        events: queue.Queue[Event],
        stdout_sink: BinaryIO,
        stderr_sink: BinaryIO,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        line_cap: int = LINE_CAP,
        byte_budget: int = BYTE_BUDGET,
        find: Find | None = None,
        keep: Callable[[Line], bool] | None = None,
        quick: Callable[[Hits], Quick | None] | None = None,
        on_chunk: Callable[[Stream, bytes], None] | None = None,
        on_stage: Callable[[str], None] | None = None,
        warm: Callable[[], object] | None = None,
        trim: Callable[[], None] = trim_heap,
        stops_at: Callable[[Sequence[ChildLine]], bool] | None = None,
        scan_on_reader: Callable[[], LiteralScan | bool] | None = None,
    ) -> Child:
        """Start `argv` (no shell) in a new session with stdin from /dev/null.

        `find`, `keep`, `quick` and `on_stage` are the line reader's (rules/linereader.py):
        the scan, which read lines become events (None: every line), the quick no that
        `keep` agrees with (rules/quick.py), and who hears of the start-up stages the scan
        finds. `warm`: called once by each reader and scanner thread before
        its first chunk (the scans' per-thread state: rules/rules.Matcher.warm_thread); it
        must not block. `trim`: hands the heap's free pages back after a written backlog (see
        the module's docstring; tests count its calls).

        Call it from the guard's long-lived loop thread: the parent-death signal fires when
        the *thread* that forked exits, not the process, so a short-lived spawning thread
        would kill the server behind the guard's back.

        `stops_at(lines)`: whether the loop, caught up, stops this child on stepping `lines`
        (supervise/machine.stops_at over its state); with `events` an EventQueue, a reader
        then sends the tree its SIGTERM before the loop steps them (the early stop: see
        `_put_lines`). None: the loop alone stops the child.

        `scan_on_reader()`: whether a reader scans the chunk it reads now, before handing it
        on (a scan that takes no GIL per hit: rules/rules.Matcher.scan_takes_gil); else the
        thread that reads its lines scans it. A LiteralScan (rules/rules.Matcher.literal_scan):
        yes, in the read's own call. None: the readers always scan.
        """
        if events.maxsize:
            raise ValueError("the event queue must be unbounded: readers never wait on it")
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_parent_death_hook(),  # noqa: PLW1509 (async-signal-safe, see hook)
            )
        except OSError as exc:
            raise InputError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        return cls(
            proc=proc,
            gen=gen,
            events=events,
            sinks=(stdout_sink, stderr_sink),
            cap=line_cap,
            budget=byte_budget,
            find=find,
            keep=keep,
            quick=quick,
            on_chunk=on_chunk,
            on_stage=on_stage,
            warm=warm,
            trim=trim,
            stops_at=stops_at,
            scan_on_reader=scan_on_reader,
        )

    def _put_lines(self, stream: Stream, lines: list[Line]) -> None:
        """Queue a chunk's lines; with `stops_at`, stop the tree first where the loop will.

        The early stop: a fatal line that the loop would act on costs the loop's wake-up,
        its steps of the lines before it and of itself (the fix planned, parsed, journaled)
        and only then the SIGTERM. When the loop has caught up (nothing queued, nothing
        being stepped: supervise/shell/eventqueue.py), the reader asks `stops_at` of the
        lines under the queue's lock, queues them in the same hold and, where the answer is
        yes, sends the SIGTERM itself (the tree walked first, as the loop's `terminate`
        does) before the loop wakes. The loop's own Stop then takes that stop over
        (`terminate`). Measured on 2 cores: bench/README.md, "Reaction, seventh round".
        """
        events = [ChildLine(self.gen, stream, line.text, line.length, line.ends,
                            line.exception) for line in lines]
        stops_at, queue_ = self._stops_at, self._events
        if stops_at is None or not isinstance(queue_, EventQueue):
            for event in events:
                queue_.put(event)
            return
        queue_.put_lines(events, lambda: stops_at(events), self._stop_early)

    def _stop_early(self) -> None:
        """A reader's SIGTERM (see `_put_lines`). It never raises: the reader must read on
        (every byte passes through), and the loop's own Stop tries again and says why."""
        with self._stop_lock:
            if self._signalled:
                return  # the loop's own stop went first
            self._signalled = True
            try:
                self._early = self._terminate_tree()
                self._early.early = True
                self._early_unwaited = True
            except Exception:  # OSError, psutil.Error, ValueError: the loop's stop tries again
                self._signalled = False
                return
            self._calm_readers()

    def _let_end(self) -> None:
        """A reader at EOF (its pipe closed): where the guard sent the tree its SIGTERM, the
        main process closes its pipes as it exits, before its end is reported; wait for that
        end (the reaper's), END_WAIT_S at most, before the reader wakes its writer and
        scanner and closes the pipe. Woken at once, the pump threads took the CPU from the
        exit: on two cores perf showed the EOF's reader preempting the dying child and the
        six pump threads ending beside it, its end reported 0.1-0.25 ms later (bench/
        README.md, "The idle reaction, the child's end"). A child the guard did not stop
        (one that ends by itself, or closes its pipes and lives on) is not waited for."""
        if self._signalled:
            self._main_ended.wait(END_WAIT_S)

    def _reap(self) -> None:
        name_this_thread(f"g{self.gen}-reaper")
        returncode = self._proc.wait()
        self._main_ended.set()
        # Normally the pipes close with the main process. A descendant that keeps them open
        # (a worker that outlived its parent) must not hide the exit: after PIPE_GRACE_S the
        # exit is reported anyway and the supervisor stops what is left of the tree.
        deadline = time.monotonic() + PIPE_GRACE_S
        for pump in self._pumps:
            pump.reader.join(max(0.0, deadline - time.monotonic()))
            pump.scanner.join(max(0.0, deadline - time.monotonic()))
        last = max((pump.lines for pump in self._pumps), key=lambda r: r.exception_ticket)
        self._events.put(ChildExited(self.gen, self.pid, returncode, last.last_exception))

    def wait_early_end(self, timeout: float) -> bool | None:
        """After a reader's early stop, wait up to `timeout` for the main process's end,
        once per stop; whether it ended (None: no early stop waited on here).

        The loop calls it before it steps the lines of an early stop (supervise/shell/
        supervisor.py, END_WAIT_S): its step's work (the journal's fsync'd records,
        its log lines, the stopper thread) then does not run beside the dying process,
        which on a small machine needs the CPU to end."""
        with self._stop_lock:
            pending, self._early_unwaited = self._early_unwaited, False
        return self._main_ended.wait(timeout) if pending else None

    def poll(self) -> int | None:
        """The main process's exit status once it was reaped, else None."""
        return self._proc.poll()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until `ChildExited` was put and every byte was written; False on timeout."""
        self._reaper.join(timeout)
        for pump in self._pumps:
            pump.writer.join(timeout)
        return not self._reaper.is_alive() and not any(p.writer.is_alive() for p in self._pumps)

    def terminate(self) -> Stopping:
        """SIGTERM the whole tree now; `stop(grace, begun=...)` does the rest."""
        with self._stop_lock:
            early, self._early = self._early, None
            self._early_unwaited = False  # the loop's step is here: nothing left to wait for
            if early is not None:  # a reader's early stop sent it: its stop, taken over
                return early
            self._signalled = True
            stopping = self._terminate_tree()
            self._calm_readers()
            return stopping

    def _calm_readers(self) -> None:
        """After the guard's SIGTERM: the pipes' readers off READER_SLICE_NS and back on the
        kernel's default slice, by their native ids, so that their wake-ups at the pipes' EOF
        do not preempt the dying tree. A reader not started yet never asks for the short one;
        one that asked just as this ran goes back at its next read (`_pace`)."""
        for pump in self._pumps:
            pump.calm = True
            tid = pump.reader.native_id
            if tid is not None and pump.reader.is_alive():
                set_slice(0, tid)

    def _terminate_tree(self) -> Stopping:
        # Once reaped, the pid number may belong to someone else; the group id stays ours
        # while any member lives (the kernel does not reuse a pid that names a group).
        return terminate_tree(self.pid if self.poll() is None else None, self.pgid)

    def stop(self, grace: float, timeout: float = 30.0, begun: Stopping | None = None
             ) -> StopReport:
        """Stop the whole tree (SIGTERM, `grace` seconds, SIGKILL), then `join(timeout)`;
        `begun`: the SIGTERM already went out (`terminate`)."""
        report = finish_stop(begun if begun is not None else self.terminate(), grace)
        self.join(timeout)
        return report
