"""rules/logline.py's fast readers against their definitions."""

from __future__ import annotations

import random

import pytest

from sglang_guard.rules import linescan
from sglang_guard.rules.logline import CLOSED, quotes_closed


@pytest.mark.parametrize("way", ["c", "python"])
def test_quotes_closed_is_its_regex_over_random_lines(way: str, monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """`quotes_closed` jumps between quotes and backslashes; `logline.CLOSED` is what it
    reads. Random lines over the characters that matter (quotes, backslashes, a newline) and
    real request records agree, a full match or not; in C (rules/_linescan.c) and in
    Python."""
    if way == "python":
        monkeypatch.setattr(linescan, "quotes_closed", None)
    elif not linescan.compiled:
        pytest.skip("the C module is not built here")
    rng = random.Random(24)  # noqa: S311 - test data, not secrets
    alphabet = ["'", '"', "\\", "a", " ", "\n", "é", "\u20ac", "\U0001f600"]
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


def test_a_lone_surrogate_is_read_in_python() -> None:
    """No UTF-8 for the C module to read: the same answer, from the Python reading."""
    assert quotes_closed("'\udc80'") is True
    assert quotes_closed("'\udc80") is False
