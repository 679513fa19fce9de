"""One way to read the guard's TOML tables: typed getters whose errors name the file and key.

The guard config, the architecture table, the backend table and the rule packs each keep
their own schema; this module only holds what they share: parsing, "bool is not a number",
unknown keys, required keys, lists of strings and choices, every failure a `ConfigError`
naming the file and the dotted key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sglang_guard.common.record import record
from sglang_guard.config.limits import toml_loads
from sglang_guard.errors import ConfigError

Kinds = type | tuple[type, ...]


def load(text: str, path: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error (or absurd nesting) is a ConfigError naming `path`."""
    import tomllib  # noqa: PLC0415 - only where TOML is read (a cached `check` reads none)

    try:
        return toml_loads(text)  # size and depth limits first (config/limits.py)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(path, None, "not valid TOML: nested too deeply") from None


def kinds_of(kinds: Kinds) -> tuple[type, ...]:
    """`kinds` as a tuple."""
    return kinds if isinstance(kinds, tuple) else (kinds,)


def is_kind(value: Any, kinds: Kinds) -> bool:
    """isinstance, except that TOML `true` is never a number (bool is an int in Python)."""
    wanted = kinds_of(kinds)
    if isinstance(value, bool) and bool not in wanted:
        return False
    return isinstance(value, wanted)


def kind_name(kinds: Kinds) -> str:
    """`int or float` for (int, float)."""
    return " or ".join("None" if k is type(None) else k.__name__ for k in kinds_of(kinds))


_MISSING = object()


@record
class Table:
    """One TOML table and where it sits (`at`, a dotted key; "" at the root)."""

    path: str
    at: str
    data: Mapping[str, Any]

    @classmethod
    def parse(cls, text: str, path: str) -> Table:
        """The root table of a TOML document."""
        return cls(path, "", load(text, path))

    def where(self, key: str | None) -> str | None:
        """The dotted key of `key` in this table (None: the table itself)."""
        if key is None:
            return self.at or None
        return f"{self.at}.{key}" if self.at else key

    def fail(self, key: str | None, problem: str) -> ConfigError:
        """A ConfigError about `key` of this table."""
        return ConfigError(self.path, self.where(key), problem)

    def known(self, allowed: Iterable[str]) -> None:
        """Unknown keys are errors: a typo must not silently fall back to a default."""
        names = set(allowed)
        for key in self.data:
            if key not in names:
                raise self.fail(key, f"unknown key (expected one of: {', '.join(sorted(names))})")

    def get(self, key: str, kinds: Kinds, default: Any = None, *, required: bool = False,
            name: str | None = None) -> Any:
        """The value of `key` if it has one of `kinds`; `default` when absent."""
        if key not in self.data:
            if required:
                raise self.fail(key, "missing")
            return default
        value = self.data[key]
        if not is_kind(value, kinds):
            raise self.fail(key, f"expected {name or kind_name(kinds)}, "
                                 f"got {type(value).__name__} {value!r}")
        return value

    def text(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        """A string value."""
        value: str | None = self.get(key, str, default, required=required)
        return value

    def must(self, key: str) -> str:
        """A required string value."""
        value: str = self.get(key, str, required=True)
        return value

    def strings(self, key: str, *, choices: Iterable[str] | None = None,
                required: bool = False) -> tuple[str, ...] | None:
        """A list of strings (each one of `choices` when given); None when absent."""
        items = self.get(key, list, required=required)
        if items is None:
            return None
        allowed = tuple(choices) if choices is not None else None
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", f"expected a list of strings, got {item!r}")
            if allowed is not None and item not in allowed:
                raise self.fail(f"{key}[{i}]", f"{item!r} is not one of {', '.join(allowed)}")
        return tuple(items)

    def choice(self, key: str, choices: Iterable[str], default: Any = _MISSING) -> str:
        """A string that is one of `choices` (required unless a default is given)."""
        allowed = tuple(choices)
        value = self.get(key, str, None if default is _MISSING else default,
                         required=default is _MISSING)
        if value not in allowed:
            raise self.fail(key, f"expected one of {', '.join(allowed)}, got {value!r}")
        return str(value)

    def table(self, key: str, *, required: bool = False) -> Table:
        """The sub-table at `key` (empty when absent and not required)."""
        value = self.get(key, dict, {}, required=required, name="a table")
        return Table(self.path, self.where(key) or key, value)

    def child(self, at: str, value: Any) -> Table:
        """`value` (e.g. an item of an array of tables) as a table at dotted key `at`."""
        if not isinstance(value, dict):
            raise ConfigError(self.path, at, f"expected a table, got {type(value).__name__}")
        return Table(self.path, at, value)
