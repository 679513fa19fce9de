"""One raw log line from the child, made safe and cheap to match: `clean(raw, cap) -> str`.

Runs on every line SGLang prints, so the common case (no escape byte, shorter than the cap)
is a single `find`, one decode and one `rstrip`.
"""

from __future__ import annotations

import re

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
        raw = _ANSI.sub(b"", raw)
    if b"\x00" in raw or b"\x1b" in raw:
        raw = raw.translate(None, _DROP)
    return raw.decode("utf-8", "replace").rstrip("\r\n")


def clean_block(raw: bytes) -> bytes:
    """`clean` for many lines at once, as bytes: newlines kept, no cap, no decoding.

    The reader's prefilter runs RE2 on these bytes directly (RE2 reads UTF-8 and simply
    fails to match invalid sequences), which saves a decode and re-encode per chunk.
    """
    if b"\x1b" in raw:
        raw = _ANSI.sub(b"", raw)
    if b"\x00" in raw or b"\x1b" in raw:
        raw = raw.translate(None, _DROP)
    return raw
