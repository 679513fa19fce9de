"""Size, depth and alias limits for the JSON, TOML and YAML the guard reads.

Python's json and tomllib recurse per nesting level (100k `[` is a RecursionError), and a YAML
of ten lines with aliases (billion laughs) expands to billions of nodes once walked. Inputs are
checked before they are parsed: a cheap scan of the bracket depth outside strings for JSON and
TOML, and a YAML loader that counts nodes as aliases expand them. Every limit is far above
what a real model config, guard config, rule pack or SGLang YAML needs (README: "Limits").
"""

from __future__ import annotations

import functools
import re
from typing import Any

MAX_JSON_BYTES = 64 << 20  # a model's config.json (the largest real ones are a few MB)
MAX_TOML_BYTES = 4 << 20  # a guard config or a rule pack
MAX_YAML_BYTES = 4 << 20  # an SGLang --config YAML
MAX_DEPTH = 100  # nesting of arrays/objects/tables (real configs: under 10)
MAX_YAML_NODES = 100_000  # YAML nodes after alias expansion

_JSON_TOKENS = r'"(?:[^"\\]|\\.)*"|[\[\]{}]'
_TOML_TOKENS = (
    r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]'
)
_OPEN = frozenset("[{")


class LimitError(ValueError):
    """An input over one of the limits; `str()` says which."""


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)  # on first use: a cached `check` reads no TOML


def _too_deep(text: str, tokens: str, limit: int) -> bool:
    """True as soon as brackets outside strings (and comments) nest deeper than `limit`."""
    depth = 0
    for m in _compiled(tokens).finditer(text):
        tok = m.group()
        if tok in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif tok in ("]", "}"):
            depth = max(0, depth - 1)
    return False


def check_json(data: bytes | str, what: str = "JSON") -> None:
    """LimitError when `data` is larger or nested deeper than a JSON input may be."""
    if len(data) > MAX_JSON_BYTES:
        raise LimitError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB")
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if _too_deep(text, _JSON_TOKENS, MAX_DEPTH):
        raise LimitError(f"{what} is nested deeper than {MAX_DEPTH} levels")


@functools.cache
def toml_limit_error() -> type[ValueError]:
    """The error of a TOML input over a limit: a TOMLDecodeError, so every reader's handler
    says it (made on first use: tomllib is imported only where TOML is read)."""
    import tomllib  # noqa: PLC0415

    class TOMLLimitError(tomllib.TOMLDecodeError):
        """A TOML input over a limit."""

    return TOMLLimitError


def toml_loads(text: str) -> dict[str, Any]:
    """`tomllib.loads` with the size and depth limits checked first (toml_limit_error())."""
    import tomllib  # noqa: PLC0415 - pure Python, with regexes of its own: only when read

    if len(text) > MAX_TOML_BYTES:
        raise toml_limit_error()(f"larger than {MAX_TOML_BYTES >> 20} MiB")
    if _too_deep(text, _TOML_TOKENS, MAX_DEPTH + 1):  # +1: a [[table]] header is two brackets
        raise toml_limit_error()(f"nested deeper than {MAX_DEPTH} levels")
    return tomllib.loads(text)


def yaml_safe_load(text: str) -> Any:
    """`yaml.safe_load` that refuses (yaml.YAMLError) big, deep or alias-bomb documents."""
    import yaml  # noqa: PLC0415 - only command lines with --config need it

    if len(text) > MAX_YAML_BYTES:
        raise yaml.YAMLError(f"larger than {MAX_YAML_BYTES >> 20} MiB")
    loader = _bounded_loader(yaml)(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _bounded_loader(yaml: Any) -> Any:
    """A SafeLoader that weighs every node, aliases expanded, as it composes them."""

    class Bounded(yaml.SafeLoader):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._weights: dict[int, int] = {}
            self._depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels")
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            weight = self._weights.get(id(node))
            if weight is None:  # a new node (an alias returns one weighed already)
                weight = 1
                if isinstance(node, yaml.SequenceNode):
                    weight += sum(self._weights.get(id(c), 1) for c in node.value)
                elif isinstance(node, yaml.MappingNode):
                    weight += sum(self._weights.get(id(k), 1) + self._weights.get(id(v), 1)
                                  for k, v in node.value)
                self._weights[id(node)] = weight
            if weight > MAX_YAML_NODES:
                raise yaml.YAMLError(f"more than {MAX_YAML_NODES:,} nodes once its aliases "
                                     "are expanded (an alias bomb?)")
            return node

    return Bounded
