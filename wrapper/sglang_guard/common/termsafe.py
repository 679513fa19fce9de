"""Text from a record or a log, made safe to print on a terminal.

A log line or a dataset record may hold ESC sequences (CSI: colours, cursor moves, screen
clears; OSC: window titles, hyperlinks, clipboard writes), a bare CR that overwrites the
line, or C1 controls that some terminals read as ESC. Printed raw, they rewrite what the
operator sees. Here every control character but newline and tab becomes a visible escape
(`\\x1b`, `\\r`), so the text reads as it was, and nothing in it acts.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r", "\x1b": "\\x1b", "\x00": "\\x00"}


def printable(text: str) -> str:
    """`text` with every control character (newline and tab aside) shown as an escape."""
    def show(m: re.Match[str]) -> str:
        ch = m.group(0)
        return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")

    return _CONTROL.sub(show, text)
