"""Is a message of SGLang's (a template with `{placeholders}`) in a release's source text?

The test the release tables rest on: a check acts only on a release whose own source holds
its message. Messages split over adjacent string literals across lines are joined first, as
Python joins them; short literal parts ("on ", "SM") say nothing and are not looked for.
"""

from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
# Adjacent string literals across a line break ("... SM<=90. "\n    "Please use ...").
_JOIN = re.compile(r"(?P<q>[\"'])[ \t]*(?:\\)?\n[ \t]*[frbFRB]{0,2}(?P=q)")
MIN_PART = 8
# Package paths that are not the server: the diffusion runtime and the test suites hold none
# of its checks (and are a third of the source to search).
NOT_SERVER = ("sglang/multimodal_gen/", "sglang/test/")


def normalise(source: str) -> str:
    """Source text with split string literals joined."""
    return _JOIN.sub("", source)


def parts(message: str) -> list[str]:
    """The literal parts of a message template that must appear in the source."""
    return [p for p in _PLACEHOLDER.split(message) if len(p.strip()) >= MIN_PART]


def holds(text: str, message: str) -> bool:
    """True if every long literal part of `message` is in (normalised) `text`."""
    found = parts(message)
    return bool(found) and all(p in text for p in found)
