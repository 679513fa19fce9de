"""rules/logline.py's fast readers against their definitions."""

from __future__ import annotations

import random

from sglang_guard.rules.logline import CLOSED, quotes_closed


def test_quotes_closed_is_its_regex_over_random_lines() -> None:
    """`quotes_closed` jumps between quotes and backslashes; `logline.CLOSED` is what it
    reads. Random lines over the characters that matter (quotes, backslashes, a newline) and
    real request records agree, a full match or not."""
    rng = random.Random(24)  # noqa: S311 - test data, not secrets
    alphabet = ["'", '"', "\\", "a", " ", "\n", "é"]
    lines = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14)))
             for _ in range(20000)]
    lines += ["[2026-11-29 16:50:40] Receive: obj=GenerateReqInput(rid='x', text='it\\'s \"ok\"')",
              "[2026-11-29 16:50:40] Receive: obj=GenerateReqInput(rid='x', text='open",
              '[2026-11-29 16:50:40] {"event": "request.finished", "out": "a \\"b\\" c"}']
    closed = 0
    for line in lines:
        found = CLOSED.match(line)
        want = found is not None and found.end() == len(line)
        assert quotes_closed(line) == want, line
        closed += want
    assert 1000 < closed < len(lines) - 1000  # both answers are well represented
