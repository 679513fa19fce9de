"""`sglang-guard explain`: run the rule packs over a saved log, as the supervisor would."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_guard.core.guardconfig import GuardConfig
from sglang_guard.core.logline import LINE_CAP, clean
from sglang_guard.core.rules import Matcher, Rule
from sglang_guard.errors import EXIT_ENVIRONMENT, InputError
from sglang_guard.shell.packs import load_packs


@dataclass(frozen=True, slots=True)
class Match:
    """One log line and the rule it triggers."""

    line_no: int
    line: str
    rule: Rule
    why: str = ""  # the rule's reason with the line's named groups filled in

    def as_dict(self) -> dict[str, Any]:
        """The `explain --json` shape."""
        r = self.rule
        return {"line_no": self.line_no, "line": self.line, "rule": r.id,
                "flag": r.flags[0] if r.flags else None, "flags": list(r.flags),
                "action": r.action, "new_value": r.new_value, "fatal": r.fatal,
                "reason": self.why or r.reason, "source": r.source, "record": r.record,
                "explanation": r.explanation, "solutions": list(r.solutions),
                "prevention": list(r.prevention)}

    def render(self) -> str:
        """Three lines for a person (and a dataset record's advice, when the rule has one)."""
        r = self.rule
        target = f" {' / '.join(r.flags)}" if r.flags else ""
        value = f" -> {r.new_value}" if r.new_value else ""
        action = f"{r.action} (exit {EXIT_ENVIRONMENT})" if r.action == "environment" else r.action
        text = (f"line {self.line_no}: {self.line}\n"
                f"  rule {r.id} ({r.pack}): {action}{target}{value}\n"
                f"  why: {self.why or r.reason}")
        return text + advice_text(r)


def advice_text(rule: Rule) -> str:
    """The dataset record's explanation, solutions and prevention tips, indented."""
    lines = [f"  record: {rule.record}"] if rule.record else []
    lines += [f"  {part}" for part in rule.explanation.splitlines() if part.strip()]
    lines += [f"  solution: {s}" for s in rule.solutions]
    lines += [f"  prevention: {p}" for p in rule.prevention]
    return "".join("\n" + line for line in lines)


def _lines(logfile: str) -> Iterator[bytes]:
    if logfile == "-":
        yield from sys.stdin.buffer
        return
    try:
        with Path(logfile).open("rb") as fh:
            yield from fh
    except OSError as exc:
        raise InputError(f"cannot read {logfile}: {exc.strerror}") from None


def explain_log(logfile: str, cfg: GuardConfig) -> list[Match]:
    """Every matching line, fatal matches first (each group in log order)."""
    matcher = Matcher(load_packs(cfg))
    found: list[Match] = []
    for n, raw in enumerate(_lines(logfile), start=1):
        text = clean(raw[:LINE_CAP], LINE_CAP)
        rules = matcher.candidates(text)
        if rules:
            best = sorted(rules, key=lambda r: (not r.fatal, r.action == "advice",
                                                -r.priority))[0]
            found.append(Match(n, text, best, matcher.diagnose(best, text)))
    return sorted(found, key=lambda m: (not m.rule.fatal, m.rule.priority < 0, m.line_no))
