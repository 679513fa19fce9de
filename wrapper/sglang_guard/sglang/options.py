"""SGLang's option table as data, and argparse's way of finding an option in a token.

The table is a dump of SGLang's own parser (tools/extract_sglang_options.py), so the guard
reads a command line the way `sglang.launch_server` does without importing SGLang.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from sglang_guard.common.record import record
from sglang_guard.errors import ConfigError

NargsT = int | str | None
YamlKind = Literal["store_true", "value", "unsupported"]

# SGLang's attention-backend options: configs/backends.toml is checked against each, and
# the guard config's policy tables apply to these flags only.
BACKEND_FLAGS: tuple[str, ...] = (
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
    "--speculative-draft-attention-backend",
)

# argparse's own test for "looks like a negative number" (argparse.py, _negative_number_matcher).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@record
class OptionSpec:
    """One SGLang option: its spellings, where it stores, and how many values it takes."""

    strings: tuple[str, ...]
    dest: str
    action: str
    nargs: NargsT
    choices: tuple[str, ...] | None
    store_true: bool
    yaml: YamlKind
    type: Literal["int", "float"] | None = None  # argparse `type=`: None takes any string
    # The release's default (argparse's, read from its source); NO_DEFAULT where the table
    # does not know it (not a scalar, or set by a custom Action).
    default: Any = None
    has_default: bool = False

    @property
    def canonical(self) -> str:
        """The first long spelling, e.g. `--model-path` for `--model`."""
        return next((s for s in self.strings if s.startswith("--")), self.strings[0])

    @property
    def takes_value(self) -> bool:
        """False for flags such as `--trust-remote-code`."""
        return self.nargs != 0


@record
class Lookup:
    """How argparse reads one token that starts with `-`."""

    kind: Literal["exact", "abbrev", "ambiguous", "unknown", "not_option"]
    spec: OptionSpec | None = None
    option: str | None = None  # the option string matched (full spelling)
    explicit: str | None = None  # the value after `=`, when given inline
    matches: tuple[str, ...] = ()  # for ambiguous prefixes


@record
class OptionTable:
    """The whole parser: every option, indexed by spelling and by dest."""

    sglang_version: str
    options: tuple[OptionSpec, ...]
    by_string: Mapping[str, OptionSpec]
    by_dest: Mapping[str, OptionSpec]
    allow_abbrev: bool = True

    def get(self, name: str) -> OptionSpec | None:
        """The option with this exact spelling or dest; None when this release has none
        (an option a release lacks is a normal state: 0.5.1-0.5.6 have no draft backend)."""
        if name in self.by_string:
            return self.by_string[name]
        return self.by_dest.get(name.lstrip("-").replace("-", "_"))

    def has(self, name: str) -> bool:
        """True when this release has the option (spelling or dest)."""
        return self.get(name) is not None

    def spec(self, name: str) -> OptionSpec:
        """The option with this exact spelling or dest; KeyError when SGLang has none.
        Only for options every release has (`--model-path`); else use `get`."""
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def lookup(self, token: str) -> Lookup:
        """Classify `token` exactly as Python 3.11's argparse `_parse_optional` does."""
        if not token or token[0] != "-":
            return Lookup("not_option")
        if token in self.by_string:
            return Lookup("exact", self.by_string[token], token)
        if len(token) == 1:
            return Lookup("not_option")
        if "=" in token:
            head, explicit = token.split("=", 1)
            if head in self.by_string:
                return Lookup("exact", self.by_string[head], head, explicit)
        if self.allow_abbrev and token.startswith("--"):
            prefix, sep, rest = token.partition("=")
            explicit_arg = rest if sep else None
            hits = tuple(s for s in self.by_string if s.startswith(prefix))
            if len(hits) > 1:
                return Lookup("ambiguous", matches=hits)
            if len(hits) == 1:
                return Lookup("abbrev", self.by_string[hits[0]], hits[0], explicit_arg)
        if _NEGATIVE_NUMBER.match(token) or " " in token:
            return Lookup("not_option")
        return Lookup("unknown")


def parse_table(data: Mapping[str, Any], path: str) -> OptionTable:
    """Build the table from the JSON dump; errors name the file and the entry."""
    try:
        options = tuple(
            OptionSpec(
                strings=tuple(o["strings"]),
                dest=str(o["dest"]),
                action=str(o["action"]),
                nargs=o["nargs"],
                choices=tuple(o["choices"]) if o["choices"] is not None else None,
                store_true=bool(o["store_true"]),
                yaml=o["yaml"],
                type=o.get("type") if o.get("type") in ("int", "float") else None,
                default=o.get("default"),
                has_default="default" in o,
            )
            for o in data["options"]
        )
        version = str(data["sglang_version"])
    except (KeyError, TypeError) as exc:
        raise ConfigError(path, "options", f"not an SGLang option dump ({exc!r})") from exc
    by_string = {s: o for o in options for s in o.strings}
    by_dest = {o.dest: o for o in options}
    return OptionTable(version, options, by_string, by_dest, bool(data.get("allow_abbrev", True)))
