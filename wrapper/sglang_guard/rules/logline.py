"""One raw log line from the child, made safe and cheap to match: `clean(raw, cap) -> str`.

Runs on every line SGLang prints, so the common case (no escape byte, shorter than the cap)
is a single `find`, one decode and one `rstrip`.
"""

from __future__ import annotations

import re

from sglang_guard.rules import linescan

LINE_CAP = 64 * 1024  # bytes of a line kept for matching; the rest is passed through only

# ECMA-48 sequences a terminal would swallow: CSI (ESC [ params intermediates final),
# OSC (ESC ] ... BEL or ESC \, or cut off by the end of the line), and the two-byte or
# nF forms (ESC, optional intermediates 0x20-0x2F, one final byte 0x30-0x7E).
# A stdlib pattern is fine here: it is fixed, ours, and linear on any input.
_ANSI = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]"
    rb"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    rb"|\x1b[ -/]*[0-~]"
)
# What survives the pattern: a lone ESC (cut at the cap, say) and NUL bytes, which some
# consumers (C strings, terminals) treat as terminators.
_DROP = b"\x1b\x00"


def _head(raw: bytes, cap: int) -> bytes:
    """The first `cap` bytes, backed off so that no UTF-8 character is split."""
    head = raw[:cap]
    # Step back over continuation bytes (10xxxxxx) to the lead byte, and drop that lead
    # byte when its character does not fit whole.
    end = len(head)
    i = end - 1
    while i >= 0 and end - i <= 4 and (head[i] & 0xC0) == 0x80:
        i -= 1
    if i >= 0 and head[i] >= 0xC0:
        need = 2 if head[i] < 0xE0 else 3 if head[i] < 0xF0 else 4
        if end - i < need:
            return head[:i]
    return head


def clean(raw: bytes, cap: int) -> str:
    """Strip ANSI escapes, NULs and the line ending; decode UTF-8 (replacing); keep the head."""
    if len(raw) > cap:
        raw = _head(raw, cap)
    if b"\x1b" in raw:
        raw = _strip_escapes(raw)
    if b"\x00" in raw:
        raw = raw.translate(None, _DROP)
    return raw.decode("utf-8", "replace").rstrip("\r\n")


def _strip_escapes(raw: bytes) -> bytes:
    """`_ANSI.sub` then dropping lone ESCs, jumping from ESC to ESC (memchr) instead of
    trying the pattern at every byte."""
    pieces, start = [], 0
    at = raw.find(b"\x1b")
    while at >= 0:
        pieces.append(raw[start:at])
        found = _ANSI.match(raw, at)
        start = found.end() if found else at + 1  # a lone ESC goes too, as _DROP has it
        at = raw.find(b"\x1b", start)
    pieces.append(raw[start:])
    return b"".join(pieces)


# --- SGLang's own error output -----------------------------------------------------------
# What a rule may act on (issue 12): an exception line that ends a traceback, a record at
# error level, argparse's own error line, or the message of an SGLang log record. A logged
# request (`Receive: obj=...`, `Finish: obj=...`), an HTTP access line or a warning is none of
# these, and text inside quotes is never matched (see rules/rules.py, QUOTE_LEAD).

# SGLang's record format: "[%(asctime)s{.ms}{prefix}] %(message)s" with datefmt
# "%Y-%m-%d %H:%M:%S" and prefix " TP0", " DP0 TP1 EP0", ... (0.5.23
# srt/utils/common.py:2630). It carries no level name.
# Every repetition below is bounded: constant work per line whatever the line holds.
_RECORD = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?(?: [^\]]{0,200})?\] ")
# A level prefix inside a record or alone: uvicorn's "ERROR:    " (its default formatter
# "%(levelprefix)s %(message)s"), as in "[2026-11-29 16:50:37] ERROR:    [Errno 98] ...".
_ERROR_LEVEL = re.compile(r"(?:ERROR|CRITICAL):\s{1,16}")
# The last line of a Python traceback, at column 0: "ValueError: ...",
# "torch.OutOfMemoryError: ...", "Exception: ..." (traceback.format_exception_only); also
# the "- ImportError: ..." items of sgl_kernel's load report (sgl_kernel/load_utils.py).
# A class name has a lower-case letter: "WARNING:" and "INFO:" are level names, not classes.
EXCEPTION_PATTERN = r"(?:- )?(?:[A-Za-z_]\w{0,63}\.){0,8}[A-Z][A-Z0-9_]{0,63}[a-z]\w{0,127}(?::|$)"
_EXCEPTION = re.compile(EXCEPTION_PATTERN)
# argparse's error line: "sglang serve: error: ...", "launch_server.py: error: ..."
# (Python 3.11 argparse.py, ArgumentParser.error).
_ARGPARSE = re.compile(r"[^\s:]{1,128}(?: [^\s:]{1,128})?: (?=error: )")


# A log collector's line prefix, as in a pasted `docker compose` log ("svc  | ..."): dropped.
_COLLECTOR = re.compile(r"[\w.-]{1,64}\s{1,16}\| ")


# SGLang's request logging (--log-requests, every --log-requests-level and format): a record
# whose message is "Receive: obj=...", "Receive OpenAI: obj=...", "Finish: obj=..., out=..."
# (0.5.23 srt/utils/request_logger.py:116, :158, :197) or a JSON event "request.received",
# "request.received.openai", "request.finished" (log_json, srt/utils/log_utils.py:68). What
# follows such a record up to the next record is its continuation: request text too.
REQUEST_PATTERN = r'(?:Receive(?: OpenAI)?: |Finish: |\{"event": ?"request\.)'
_REQUEST = re.compile(REQUEST_PATTERN)
# A line whose quotes all close (repr's '...' and "...", JSON's "...", backslash escapes):
# a request record that ends inside a quote continues on the next line. What
# `quotes_closed` reads, as one regex (its definition; tests/unit/test_logline.py holds the
# two to the same answers): the alternatives start with distinct characters, so it is
# linear, but it steps through every character in Python's regex engine, and a request
# record's text is long; `quotes_closed` jumps from one quote or backslash to the next.
CLOSED = re.compile(r"""(?:[^'"\\]|\\.|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")*\\?""")
_OUTSIDE = re.compile(r"""['"\\]""")
_INSIDE = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}


def is_record(line: str) -> bool:
    """Whether `line` starts as one of SGLang's own log records ("[2026-... TP0] ...")."""
    return _RECORD.match(line) is not None


def is_request(line: str) -> bool:
    """Whether `line` is a record of SGLang's request logging (a client's text, never read)."""
    record = _RECORD.match(line)
    return record is not None and _REQUEST.match(line, record.end()) is not None


def quotes_closed(line: str) -> bool:
    """Whether every quote `line` opens is closed on it (repr and JSON quoting): SGLang's
    request records always are, as repr and JSON escape newlines; one that is not (a line
    cut at the cap, a text printed raw) continues on the lines after it."""
    if linescan.quotes_closed is not None:
        try:  # per request record: a `with suppress` costs ~1 us, a try nothing
            return linescan.quotes_closed(line)
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 to read, read below
            pass
    return _quotes_closed(line)


def _quotes_closed(line: str) -> bool:
    """`quotes_closed` in Python: from one quote or backslash to the next."""
    at, size = 0, len(line)
    while (special := _OUTSIDE.search(line, at)) is not None:
        at = special.start()
        if line[at] == "\\":  # an escape outside quotes, or the line's last character
            if at + 1 == size:
                return True
            if line[at + 1] == "\n":  # nothing escapes a newline (CLOSED's `.`)
                return False
            at += 2
            continue
        inside = _INSIDE[line[at]]
        at += 1
        while True:
            found = inside.search(line, at)
            if found is None:
                return False  # the quote runs on past the line's end
            at = found.start() + 1
            if line[found.start()] != "\\":
                break  # the closing quote
            if at == size or line[at] == "\n":
                return False
            at += 1
    return True


def is_exception_line(line: str) -> bool:
    """Whether `line` is shaped like a traceback's last line ("ValueError: ...")."""
    return _EXCEPTION.match(line) is not None


def error_text(line: str, ends_traceback: bool | None = None) -> tuple[str, bool] | None:
    """The part of `line` a rule may match, and whether it must match at its start.

    None: not SGLang's error output. Exception lines, error-level records and argparse's
    error line may match anywhere outside quotes (False); a plain SGLang record, whose level
    the format does not show, only at the start of its message (True): a request record
    starts with "Receive:"/"Finish:", an access line with "INFO:", never with a rule's text.

    `ends_traceback` is what the stream's reader knows of the line (rules/tracebacks.py):
    True, it is SGLang's own output (the exception line that ends a traceback, or a line
    outside any traceback, request and message: what C++, CUDA, NCCL or Triton write to
    stderr), read anywhere outside quotes; False, it is not (frames, the rest of an
    exception's message, a request's text); None, not known: only an exception or argparse
    line is read then.
    """
    collector = _COLLECTOR.match(line)
    if collector:
        line = line[collector.end():]
    record = _RECORD.match(line)
    rest = line[record.end():] if record else line
    level = _ERROR_LEVEL.match(rest)
    if level:
        return rest[level.end():], False
    if record:
        return rest, True
    if ends_traceback:
        return line, False
    if ends_traceback is None and _EXCEPTION.match(line):
        # Only the line that ends a traceback (rules/tracebacks.py; None: not known).
        return line, False
    argparse = _ARGPARSE.match(line)
    if argparse:
        return line[argparse.end():], False
    return None


# Numbers and addresses that differ between two launches of one crash: a pid, a port, a
# byte count, a time, a pointer ("0x7f3a..."), a rank.
_VARYING = re.compile(r"0x[0-9A-Fa-f]+|\d+(?:\.\d+)?")


def crash_signature(line: str) -> str:
    """`line` with its numbers and addresses masked: the same crash, launch after launch."""
    return _VARYING.sub("#", line.strip())

