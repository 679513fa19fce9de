"""Flags the running release removed or renamed: rewritten to its spelling, or dropped.

`--cuda-graph-max-bs 64` is an ambiguous prefix from SGLang 0.5.20 (argparse exits 2); the
release's own deprecation note names `--cuda-graph-max-bs-decode` as its successor, so the
command line gets that spelling with the user's value kept. A flag removed with no successor
is dropped with that reason. The table is sglang/renames.py's, derived from the wheels.
"""

from __future__ import annotations

from sglang_guard.common.record import record
from sglang_guard.config.guardconfig import PolicyConfig
from sglang_guard.sglang.argv import CommandLine, parse_command_line
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.renames import Rename, RenameFinding, rename_findings


@record
class Respelled:
    """The command line in the release's spelling, and what was changed (or only said)."""

    cl: CommandLine
    changes: tuple[RenameFinding, ...]  # applied (policy drop/rewrite)
    refused: tuple[RenameFinding, ...]  # policy fail
    warnings: tuple[str, ...]  # policy warn, or a YAML key to rename by hand


def new_tokens(f: RenameFinding) -> list[str]:
    """The tokens that stand for `f` in the new command line."""
    if f.action == "drop" or f.new_flag is None:
        return []
    return [f.new_flag] if f.new_value is None else [f.new_flag, f.new_value]


def respell(cl: CommandLine, options: OptionTable, policy: PolicyConfig,
            renames: tuple[Rename, ...] | None = None) -> Respelled:
    """Apply the release's renames to `cl`'s command-line tokens, per the default policy."""
    found = rename_findings(cl, options, renames)
    if not found:
        return Respelled(cl, (), (), ())
    mode = policy.default
    warnings = [f"{f.flag} in the --config YAML: {f.reason} (rename the key by hand)"
                for f in found if f.index < 0]
    cli = [f for f in found if f.index >= 0]
    if mode == "warn":
        warnings += [f"{f.flag}: {f.reason}" for f in cli]
        return Respelled(cl, (), (), tuple(warnings))
    if mode == "fail":
        return Respelled(cl, (), tuple(cli), tuple(warnings))
    argv = list(cl.argv)
    for f in sorted(cli, key=lambda x: -x.index):  # from the end: earlier indices stay valid
        argv[f.index:f.index + f.count] = new_tokens(f)
    return Respelled(parse_command_line(tuple(argv), options, cl.yaml_data), tuple(cli), (),
                     tuple(warnings))
