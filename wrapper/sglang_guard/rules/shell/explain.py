"""`sglang-guard explain`: run the rule packs over a saved log, as the supervisor would."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sglang_guard.common.record import record
from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.rules import tracebacks
from sglang_guard.rules.fixes import FIX_KINDS
from sglang_guard.rules.logline import LINE_CAP, clean, error_text
from sglang_guard.rules.rules import Fix, Matcher, Rule, is_catch_all, precedence
from sglang_guard.rules.shell import logstream
from sglang_guard.rules.shell.packs import load_packs
from sglang_guard.supervise.replay import env_for, replay

MAX_MATCHES = 1000  # matches kept (each holds up to LINE_CAP bytes): memory stays bounded


@record
class Match:
    """One log line and the rule it triggers."""

    line_no: int
    line: str
    rule: Rule
    why: str = ""  # the rule's reason with the line's named groups filled in
    bare: bool = False  # read as an exception's text (see `bare_line`): listed after the rest
    ends_traceback: bool | None = None  # where the log showed it (rules/tracebacks.py)

    def as_dict(self) -> dict[str, Any]:
        """The `explain --json` shape."""
        r = self.rule
        return {"line_no": self.line_no, "line": self.line, "rule": r.id,
                "flag": r.flags[0] if r.flags else None, "flags": list(r.flags),
                "action": r.action, "new_value": r.new_value and r.new_value.text,
                "fatal": r.fatal,
                "reason": self.why or r.reason, "source": r.source, "record": r.record,
                "explanation": r.explanation, "solutions": list(r.solutions),
                "prevention": list(r.prevention)}

    def render(self) -> str:
        """Three lines for a person (and a dataset record's advice, when the rule has one)."""
        r = self.rule
        target = f" {' / '.join(r.flags)}" if r.flags else ""
        value = f" -> {r.new_value.text}" if r.new_value and r.new_value.text else ""
        action = FIX_KINDS[r.action].label or r.action
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


def log_lines(logfile: str) -> Iterator[str]:
    """The log, streamed and cleaned line by line as the supervisor sees it (bounded memory:
    each line keeps its first LINE_CAP bytes; devices are refused, see rules/shell/logstream)."""
    for raw in logstream.log_lines(logfile, LINE_CAP):
        yield clean(raw, LINE_CAP)


def explain_log(logfile: str, cfg: GuardConfig, matcher: Matcher | None = None) -> list[Match]:
    """Every matching line, fatal matches first (each group in log order)."""
    return explain_lines(log_lines(logfile), cfg, matcher)


def explain_lines(lines: Iterable[str], cfg: GuardConfig,
                  matcher: Matcher | None = None) -> list[Match]:
    """`explain_log` over lines already cleaned (at most MAX_MATCHES are kept); `matcher`:
    the guard config's packs, loaded here when not given."""
    matcher = Matcher(load_packs(cfg)) if matcher is None else matcher
    found: list[Match] = []
    state = tracebacks.UNKNOWN  # a pasted log may start anywhere (rules/tracebacks.py)
    for n, text in enumerate(lines, start=1):
        state, ends = tracebacks.step(state, text)
        rules = matcher.candidates(text, ends)
        bare = bare_line(text)
        if not rules and bare is not None:
            rules = matcher.candidates(bare)
        if rules and len(found) < MAX_MATCHES:
            best = sorted(rules, key=precedence)[0]
            found.append(Match(n, text, best, matcher.diagnose(best, bare or text),
                               bare=not matcher.candidates(text, ends), ends_traceback=ends))
    return sorted(found, key=lambda m: (m.bare, not m.rule.fatal, is_catch_all(m.rule),
                                        m.line_no))


def lead_with(matches: list[Match], fix: Fix | None) -> list[Match]:
    """`matches` with the first one of the rule the machine acted on in front (the listing
    shows it first, so that the line shown and the fix named are one decision)."""
    if fix is None:
        return matches
    at = next((i for i, m in enumerate(matches) if m.rule.id == fix.rule.id), None)
    if at is None:
        return matches
    return [matches[at], *matches[:at], *matches[at + 1:]]


def bare_line(text: str) -> str | None:
    """A pasted line that is neither SGLang's error output nor one of its records, as an
    exception's text: a message copied from an issue title or a screenshot, or wrapped by a
    comment. `explain` falls back to these only when nothing else names a fix; the
    supervisor, which reads SGLang's own pipes, never reads a line this way."""
    if not text.strip() or error_text(text) is not None or text.startswith("["):
        return None
    return f"Exception: {text}"


def matching_lines(matches: list[Match]) -> list[tuple[str, bool | None]]:
    """The lines that any rule matches, in log order, each with where the log showed it
    (`ends_traceback`): all a failure's fix is read from."""
    return [(m.line, m.ends_traceback) for m in sorted(matches, key=lambda m: m.line_no)]


def fix_as_dict(fix: Fix | None) -> dict[str, Any] | None:
    """The `explain --json` shape of the fix for a command line (None: no flag to change)."""
    if fix is None:
        return None
    return {"rule": fix.rule.id, "action": fix.action, "flag": fix.flag,
            "old_value": fix.old_value, "new_value": fix.new_value, "reason": fix.rule.reason,
            **({"free_port": True, "busy_port": fix.busy_port} if fix.free_port else {})}


def render_fix(fix: Fix | None) -> str:
    """One line for a person: what the guard would change on this command line."""
    if fix is None:
        return "fix: none (no rule changes this command line)"
    return FIX_KINDS[fix.action].render(fix)


def explain_fix(lines: Sequence[str] | Sequence[tuple[str, bool | None]], cfg: GuardConfig,
                argv: list[str], *,
                sm: int | None = None, sglang_version: str | None = None,
                matcher: Matcher | None = None) -> Fix | None:
    """The fix the supervisor would make to `argv` after this failure output (cleaned lines,
    or lines each with its `ends_traceback` as `matching_lines` gives them): the machine
    itself, replayed over them (supervise/replay.py)."""
    from sglang_guard.preflight.shell.inputs import read_command_line  # noqa: PLC0415
    from sglang_guard.sglang.releases import load_option_table  # noqa: PLC0415

    options = load_option_table()
    cl = read_command_line(argv, options)
    matcher = Matcher(load_packs(cfg)) if matcher is None else matcher
    env = env_for(matcher, options, sm=sm, sglang_version=sglang_version)
    fix = replay(lines, env, cl)
    if fix is None:
        # A pasted excerpt is not always SGLang's output as printed: a message copied from
        # an issue title or a screenshot, or wrapped by a comment. Only then, and never for
        # an SGLang record (a logged request is one), a bare line is read as an exception's
        # text. The supervisor, which reads SGLang's own pipes, never does this.
        texts = [line if isinstance(line, str) else line[0] for line in lines]
        fix = replay([(b, None) for b in map(bare_line, texts) if b is not None], env, cl)
    return fix
