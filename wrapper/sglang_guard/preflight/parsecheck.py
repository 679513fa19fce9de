"""What the release's own parser rejects, as SGLang's argparse words it (issue 19, item 3).

`prepare_server_args` (server_args.py, every 0.5.x) runs `parser.parse_args(argv)`: the first
bad value (invalid choice, invalid type, a missing value, an explicit value for a flag that
takes none) ends it at once with `error: argument --flag: ...`; unknown options and stray
values are collected and reported together at the end (`error: unrecognized arguments: ...`).
Either way SGLang exits 2 before anything loads, so such a line is never worth launching.

Pure: the parsed command line in, one `Rejection` per rejected occurrence out.
"""

from __future__ import annotations

from sglang_guard.common.record import record
from sglang_guard.sglang.argv import CommandLine, Occurrence
from sglang_guard.sglang.options import OptionTable

# Where SGLang parses its command line (the same call in every 0.5.x release).
PARSER_SOURCE = "sglang/srt/server_args.py prepare_server_args: parser.parse_args(argv)"
HELP = ("-h", "--help")  # argparse.ArgumentParser(add_help=True), SGLang's parser in 0.5.x


@record
class Rejection:
    """One occurrence SGLang's parser rejects: the flag (as written), its value, why."""

    flag: str
    value: str | None
    dest: str | None  # None: an option the release does not have
    problem: str  # argparse's own words for this occurrence
    hint: str | None  # the guard's "did you mean" (argparse on Python < 3.14 offers none)
    origin: str  # "cli" or "yaml"
    extras: str | None = None  # the tokens argparse lists as unrecognized arguments
    span: tuple[int, int] | None = None  # cli: the argv tokens (start, count) it covers
    yaml_key: str | None = None  # yaml: the key it came from


def rejections(cl: CommandLine, table: OptionTable) -> list[Rejection]:
    """Every occurrence of `cl` the release's parser rejects, in parse order.

    An unknown option and the stray values right after it (`--attention-backendd triton`)
    are one rejection: argparse lists them together as unrecognized arguments.
    """
    out: list[Rejection] = []
    occs = list(cl.occurrences)
    i = 0
    while i < len(occs):
        occ = occs[i]
        i += 1
        if occ.problem is None:
            continue
        if occ.spec is not None:
            out.append(Rejection(occ.option, occ.value, occ.spec.dest, occ.problem, None,
                                 occ.origin))
            continue
        if occ.option in HELP:  # argparse's own -h/--help (not in the option tables)
            out.append(Rejection(occ.option, None, None, f"{occ.option}: SGLang prints its "
                                 "help and exits 0; it does not serve", None, occ.origin))
            continue
        values: list[str] = list(occ.values)
        end = occ.index + occ.count
        if occ.option.startswith("-") and occ.option != "--":
            while i < len(occs) and _stray(occs[i]) and occs[i].origin == occ.origin:
                values.append(occs[i].option)
                end = occs[i].index + occs[i].count
                i += 1
        problem, extras = occ.problem, None
        if "unrecognized arguments:" in problem:
            extras = " ".join(values if occ.option == "--" else [occ.option, *values])
            problem = problem.split("unrecognized arguments:", 1)[0] + \
                f"unrecognized arguments: {extras}"
        hint = suggest(occ.option, table) if extras is not None else None
        span = (occ.index, end - occ.index) if occ.origin == "cli" else None
        out.append(Rejection(occ.option, " ".join(values) or None, None, problem, hint,
                             occ.origin, extras, span, occ.yaml_key))
    return out


def _stray(occ: Occurrence) -> bool:
    return occ.spec is None and not occ.option.startswith("-") and occ.problem is not None


def suggest(token: str, table: OptionTable) -> str | None:
    """The closest option string of the release (`--attention-backendd` -> `--attention-
    backend`), or None; computed by the guard, not by SGLang."""
    if not token.startswith("--"):
        return None
    head = token.split("=", 1)[0]
    longs = [s for s in table.by_string if s.startswith("--")]
    import difflib  # noqa: PLC0415 - only an unknown option is matched against the rest

    hits = difflib.get_close_matches(head, longs, n=1, cutoff=0.8)
    return hits[0] if hits else None


def sglang_error(found: list[Rejection]) -> str | None:
    """The one line SGLang's parser prints: the first value error, else every unrecognized
    argument together (`error: unrecognized arguments: A B`)."""
    found = [r for r in found if r.flag not in HELP]  # help is no error: it prints, exits 0
    if not found:
        return None
    first = next((r for r in found if "unrecognized arguments:" not in r.problem), None)
    if first is not None:
        return f"error: {first.problem}"
    extras = " ".join(r.extras for r in found if r.extras)
    return f"error: unrecognized arguments: {extras}"
