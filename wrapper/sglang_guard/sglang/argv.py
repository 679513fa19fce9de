"""An SGLang command line read the way SGLang 0.5.23 reads it, and edited without collateral.

SGLang's `prepare_server_args` merges `--config file.yaml` by turning the YAML into tokens
and putting them *before* the command line (so the command line wins), then runs argparse
(prefix abbreviations allowed, last occurrence wins). This module mirrors that, remembering
where every value came from, so an edit touches only the tokens (or YAML keys) it must.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from sglang_guard.common.record import record
from sglang_guard.errors import InputError
from sglang_guard.sglang.options import OptionSpec, OptionTable

CONFIG_FLAG = "--config"


@record
class Occurrence:
    """One option as SGLang's parser meets it, with the tokens it spans."""

    spec: OptionSpec | None  # None when SGLang would reject the option
    origin: Literal["cli", "yaml"]
    index: int  # cli: index of the option token in argv; yaml: -1
    count: int  # tokens spanned in argv (option + separate values); 0 for yaml
    option: str  # the option as written, without an inline `=value`
    values: tuple[str, ...]
    inline: bool  # the value was written `--flag=value`
    yaml_key: str | None = None
    problem: str | None = None

    @property
    def value(self) -> str | None:
        """The value as one string (None for flags that take none)."""
        return " ".join(self.values) if self.values else None


@record
class CommandLine:
    """A parsed SGLang command line (CLI tokens plus the `--config` YAML, if any)."""

    argv: tuple[str, ...]
    config_path: str | None
    yaml_data: Mapping[str, Any] | None
    occurrences: tuple[Occurrence, ...]  # in SGLang's parse order: YAML first, then CLI

    @property
    def problems(self) -> tuple[str, ...]:
        """Everything SGLang's parser would reject (it would exit 2 on any of these)."""
        return tuple(o.problem for o in self.occurrences if o.problem)

    def last(self, dest: str) -> Occurrence | None:
        """The occurrence that decides `dest` (argparse: the last one wins)."""
        hits = [o for o in self.occurrences if o.spec is not None and o.spec.dest == dest]
        return hits[-1] if hits else None

    def value(self, dest: str) -> str | None:
        """The effective value of `dest` as a string, or None when unset."""
        occ = self.last(dest)
        return occ.value if occ else None

    def present(self, dest: str) -> bool:
        """True when `dest` is given anywhere (CLI or YAML)."""
        return self.last(dest) is not None

    def effective(self) -> dict[str, str | None]:
        """Canonical flag -> effective value (None for flags without a value)."""
        out: dict[str, str | None] = {}
        for occ in self.occurrences:
            if occ.spec is not None:
                out[occ.spec.canonical] = occ.value
        return out


def find_config_path(argv: tuple[str, ...] | list[str]) -> str | None:
    """The YAML named by `--config`, exactly as SGLang finds it (only the two-token form)."""
    hits = [i for i, tok in enumerate(argv) if tok == CONFIG_FLAG]
    if len(hits) > 1:
        raise InputError("--config is given more than once; SGLang accepts only one config file")
    if not hits:
        return None
    if hits[0] == len(argv) - 1:
        raise InputError("--config is the last argument: it needs a YAML file path")
    path = argv[hits[0] + 1]
    if not path.lower().endswith((".yaml", ".yml")):
        raise InputError(f"--config {path}: SGLang reads only .yaml/.yml config files")
    return path


def yaml_tokens(data: Mapping[str, Any], table: OptionTable) -> list[tuple[str, list[str]]]:
    """Each YAML key with the tokens SGLang's ConfigArgumentMerger makes of it."""
    out: list[tuple[str, list[str]]] = []
    for key, value in data.items():
        spec = _spec_for_yaml_key(str(key), table)
        if spec is not None and spec.yaml == "unsupported":
            raise InputError(
                f"config key {key!r}: SGLang cannot take {spec.canonical} from a YAML file"
            )
        flag = f"--{key}"
        if isinstance(value, bool):
            store_true = spec is not None and spec.store_true
            toks = ([flag] if value else []) if store_true else [flag, str(value).lower()]
        elif isinstance(value, list):
            toks = [flag, *(str(v) for v in value)] if value else []
        elif isinstance(value, dict):
            toks = [flag, json.dumps(value)]
        else:
            toks = [flag, str(value)]
        out.append((str(key), toks))
    return out


def _spec_for_yaml_key(key: str, table: OptionTable) -> OptionSpec | None:
    norm = key.replace("-", "_")
    for spec in table.options:
        names = {spec.dest} | {s[2:].replace("-", "_") for s in spec.strings if s.startswith("--")}
        if norm in names:
            return spec
    return None


def parse_command_line(
    argv: tuple[str, ...] | list[str],
    table: OptionTable,
    yaml_data: Mapping[str, Any] | None = None,
) -> CommandLine:
    """Parse `argv` (the args after `launch_server`), with the `--config` YAML already loaded."""
    argv = tuple(argv)
    config_path = find_config_path(argv)
    if config_path is not None and yaml_data is None:
        raise InputError(f"--config {config_path}: the YAML file was not loaded")
    occurrences: list[Occurrence] = []
    if config_path is not None and yaml_data is not None:
        for key, toks in yaml_tokens(yaml_data, table):
            for occ in _scan(toks, table, "cli"):
                occurrences.append(_as_yaml(occ, key))
        cut = argv.index(CONFIG_FLAG)
        cli_index = [i for i in range(len(argv)) if i not in (cut, cut + 1)]
    else:
        cli_index = list(range(len(argv)))
    for occ in _scan([argv[i] for i in cli_index], table, "cli"):
        occurrences.append(_reindex(occ, cli_index))
    return CommandLine(argv, config_path, yaml_data, tuple(occurrences))


def _as_yaml(occ: Occurrence, key: str) -> Occurrence:
    return Occurrence(
        occ.spec, "yaml", -1, 0, occ.option, occ.values, False, key,
        f"in {CONFIG_FLAG} YAML key {key!r}: {occ.problem}" if occ.problem else None,
    )


def _reindex(occ: Occurrence, index: list[int]) -> Occurrence:
    start = index[occ.index]
    end = index[occ.index + occ.count - 1] + 1 if occ.count else start
    return Occurrence(
        occ.spec, "cli", start, end - start, occ.option, occ.values, occ.inline, None, occ.problem
    )


def _is_option(tok: str, table: OptionTable) -> bool:
    return table.lookup(tok).kind != "not_option"


def _scan(
    tokens: list[str], table: OptionTable, origin: Literal["cli", "yaml"]
) -> list[Occurrence]:
    """Walk tokens the way argparse consumes them (SGLang's parser has no positionals)."""
    out: list[Occurrence] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":  # argparse: everything after is positional, and SGLang takes none
            rest = tuple(tokens[i + 1 :])
            out.append(Occurrence(None, origin, i, len(tokens) - i, tok, rest, False,
                                  problem=f"unrecognized arguments: {' '.join(rest)}"))
            break
        look = table.lookup(tok)
        if look.kind == "not_option":
            out.append(Occurrence(None, origin, i, 1, tok, (), False,
                                  problem=f"unrecognized arguments: {tok}"))
            i += 1
            continue
        if look.kind in ("ambiguous", "unknown") or look.spec is None:
            bad = (
                f"ambiguous option: {tok} could match {', '.join(look.matches)}"
                if look.kind == "ambiguous"
                else f"unrecognized arguments: {tok}"
            )
            out.append(Occurrence(None, origin, i, 1, tok, (), False, problem=bad))
            i += 1
            continue
        spec = look.spec
        written = tok.split("=", 1)[0] if look.explicit is not None else tok
        values, used, problem = _consume(spec, look.explicit, tokens, i + 1, table)
        out.append(Occurrence(spec, origin, i, 1 + used, written, values,
                              look.explicit is not None, problem=problem))
        i += 1 + used
    return out


def _consume(
    spec: OptionSpec, explicit: str | None, tokens: list[str], start: int, table: OptionTable
) -> tuple[tuple[str, ...], int, str | None]:
    """Values for `spec` (argparse `_match_argument`): (values, tokens used, problem)."""
    nargs = spec.nargs
    if explicit is not None:
        if nargs == 0:
            return (), 0, f"argument {_name(spec)}: ignored explicit argument {explicit!r}"
        # argparse checks choices on `--flag=value` too (`_get_values` -> `_check_value`).
        return (explicit,), 0, _bad_type(spec, (explicit,)) or _bad_choice(spec, (explicit,))
    following: list[str] = []
    for tok in tokens[start:]:
        if tok == "--" or _is_option(tok, table):
            break
        following.append(tok)
    want: int | None
    if nargs is None:
        want = 1
    elif isinstance(nargs, int):
        want = nargs
    elif nargs == "?":
        want = min(1, len(following))
    else:  # "+", "*", and argparse.REMAINDER-like forms take every value token
        want = len(following)
        if nargs == "+" and want == 0:
            return (), 0, f"argument {_name(spec)}: expected at least one argument"
    if len(following) < want:
        noun = "one argument" if want == 1 else f"{want} arguments"
        return (), 0, f"argument {_name(spec)}: expected {noun}"
    values = tuple(following[:want])
    return values, want, _bad_type(spec, values) or _bad_choice(spec, values)


def _bad_type(spec: OptionSpec, values: tuple[str, ...]) -> str | None:
    """argparse's `_get_value` (before the choices check): `invalid int value: 'x'`."""
    if spec.type is None:
        return None
    convert = int if spec.type == "int" else float
    for v in values:
        try:
            convert(v)
        except ValueError:
            return f"argument {_name(spec)}: invalid {spec.type} value: {v!r}"
    return None


def _name(spec: OptionSpec) -> str:
    """How argparse names an option in its errors (`_get_action_name`): every spelling."""
    return "/".join(spec.strings)


def _bad_choice(spec: OptionSpec, values: tuple[str, ...]) -> str | None:
    """argparse's own words (Python 3.11 `_check_value`), naming the option as written first
    in its add_argument call (argparse joins every spelling with `/`)."""
    bad = [v for v in values if spec.choices is not None and v not in spec.choices]
    if not bad or spec.choices is None:
        return None
    choices = ", ".join(repr(c) for c in spec.choices)
    return f"argument {_name(spec)}: invalid choice: {bad[0]!r} (choose from {choices})"


def effective_value(cl: CommandLine, table: OptionTable, dest: str) -> tuple[str | None, bool]:
    """The value SGLang's parser ends with for `dest`: the last occurrence's, else the
    release's own default (from its table); and whether it is that default. None: unset and
    no scalar default known (or the release has no such option)."""
    occ = cl.last(dest)
    if occ is not None:
        return occ.value, False
    spec = table.get(dest)
    if spec is None or not spec.has_default or spec.default is None or spec.store_true:
        return None, False
    default = spec.default
    return (str(default).lower() if isinstance(default, bool) else str(default)), True


def remote_code_trust(cl: CommandLine) -> tuple[bool, str | None]:
    """Whether SGLang would run the model's own code: (trusted, why not, when it was asked).

    Only when SGLang's parser accepts the whole command line and stores True: it exits 2 on
    `--trust-remote-code=no` (a store_true flag takes no value) and on a YAML
    `trust-remote-code: "false"` (ConfigArgumentMerger passes a string as `--flag false`,
    and `false` is then an unrecognized argument), so the model never loads with remote code.
    """
    occ = cl.last("trust_remote_code")
    if occ is None:
        return False, None
    problems = ([occ.problem] if occ.problem else []) + [p for p in cl.problems
                                                          if p != occ.problem]
    if problems:
        return False, (f"{occ.option} is not honoured: SGLang's parser would reject the command "
                       f"line ({problems[0]}); the model is read without its remote code")
    return True, None
