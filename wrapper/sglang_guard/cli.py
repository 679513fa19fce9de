"""`sglang-guard` commands; errors become exit statuses in `entry.guarded`."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from sglang_guard import __version__
from sglang_guard.checkcmd import load_config, run_check
from sglang_guard.config.guardconfig import POLICY_MODES, GuardConfig, with_overrides
from sglang_guard.entry import guarded, run_process

F = TypeVar("F", bound=Callable[..., Any])


def _common(fn: F) -> F:
    """Options shared by `check` and `run`."""
    fn = click.option("--policy", type=click.Choice(POLICY_MODES), default=None,
                      help="What to do with a flag that does not fit "
                           "(default: drop, or the config's).")(fn)
    fn = click.option("--gpu-sm", default=None, metavar="auto|none|SM",
                      help="GPU compute capability: auto (NVML), none (no GPU), "
                           "or e.g. 90, 100, 120.")(fn)
    fn = click.option("--config", "config_path", default=None, metavar="GUARD.toml",
                      help="The guard's config file (also $SGLANG_GUARD_CONFIG).")(fn)
    return fn


def sglang_args(cfg: GuardConfig, args: Sequence[str]) -> list[str]:
    """The SGLang arguments: those after `--`, else the guard config's."""
    out = list(args or cfg.sglang_argv())
    if not out:
        raise click.UsageError("no SGLang arguments: give them after `--` or in the guard config")
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sglang-guard")
def main() -> None:
    """Launch SGLang with its flags checked against the model and GPU, and fixed by policy.

    \b
    sglang-guard check -- --model-path DIR --attention-backend cutedsl_mla
    sglang-guard run   -- --model-path DIR --attention-backend cutedsl_mla
    sglang-guard serve DIR --attention-backend cutedsl_mla   (as `sglang serve`)
    sglang-guard explain server.log
    sglang-guard rules import errors.jsonl -o imported.toml --sglang-version '>=0.5.23,<0.5.24'
    """


@main.command(context_settings={"ignore_unknown_options": True})
@_common
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--state-dir", default=None, help="Where derived SGLang YAML files are named.")
@click.option("--sglang-version", default=None, metavar="V",
              help="Decide for this SGLang release (default: --python's, else that of the "
                   "interpreter a pasted command names by path, else the newest table).")
@click.option("--python", "python", default=None, metavar="PATH",
              help="Read the SGLang release from this interpreter's installed package.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@guarded
def check(*, policy: str | None, gpu_sm: str | None, config_path: str | None, as_json: bool,
          state_dir: str | None, sglang_version: str | None, python: str | None,
          args: tuple[str, ...]) -> None:
    """Show what preflight decides for an SGLang command line, without launching.

    The words after `--` may be a whole command line (`python3 -m sglang.launch_server …`,
    `sglang serve MODEL …`): its launcher is left out, and an interpreter named by path
    decides the release. A `sglang serve` line SGLang serves with another backend (a
    diffusion pipeline) is not checked.

    Exit status: 0 ok (or not checked), 1 remediated, 78 refused, 2 bad usage or input
    (also: rejected, a command line the release's own parser rejects), 69 --python has no
    SGLang.
    """
    run_check(policy=policy, gpu_sm=gpu_sm, config_path=config_path, as_json=as_json,
              state_dir=state_dir, sglang_version=sglang_version, python=python, args=args,
              echo=click.echo, sglang_args=sglang_args)


@main.command(context_settings={"ignore_unknown_options": True})
@_common
@click.option("--python", "python", default=None, metavar="PATH",
              help="Interpreter that runs `-m sglang.launch_server` (default: this one).")
@click.option("--state-dir", default=None, help="Journal and derived configs, one guard per "
              "dir (default: $SGLANG_GUARD_STATE_DIR, else $XDG_STATE_HOME or ~/.local/state, "
              "or /var/lib for root, then sglang-guard/port-<--port>).")
@click.option("--no-preflight", is_flag=True, help="Skip preflight: only the log rules act.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default=None)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@guarded
def run(policy: str | None, gpu_sm: str | None, config_path: str | None, python: str | None,
        state_dir: str | None, no_preflight: bool, log_format: str | None,
        args: tuple[str, ...]) -> None:
    """Preflight, then run SGLang and fix its command line when a fatal log line appears.

    \b
    Exit status:
      0   after SIGTERM/SIGINT (SGLang's whole tree stopped first)
      2   bad usage or input (a missing model, a bad config, no group secret, a command
          line SGLang's parser rejects: never launched)
      69  SGLang's environment is broken (or the interpreter has no SGLang)
      70  a bug in the guard
      75  the guard gave up (crash loop, a fix that did not hold, busy port)
      76  a group worker lost its leader (or never reached it)
      78  the policy refused the command line (or a group leader refused this node)
    """
    cfg = load_config(config_path, policy, gpu_sm)

    def overrides(fresh: GuardConfig) -> GuardConfig:
        return with_overrides(fresh, policy, gpu_sm)

    argv = sglang_args(cfg, args)
    from sglang_guard.sglang.launcher import is_serve_launch  # noqa: PLC0415

    if is_serve_launch(cfg.sglang.launch):  # a diffusion pipeline is SGLang's alone
        from sglang_guard.serve import hand_over, refuse_unservable  # noqa: PLC0415

        reading = refuse_unservable(cfg, argv, cfg.sglang.python)  # as run resolves it
        hand_over(cfg.sglang.launch, argv, reading)
    run_process(cfg, argv, python=python, state_dir=state_dir,
                preflight=not no_preflight, log_format=log_format, argv_from_config=not args,
                overrides=overrides)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                "help_option_names": []}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args: tuple[str, ...]) -> None:
    """`sglang serve ARGS…` under the guard: the same arguments, launched as `sglang serve`.

    Guard settings come from SGLANG_GUARD_* variables and the guard config files, as for
    sglang-guard-launch; --help shows `sglang serve --help`.
    """
    from sglang_guard.serve import main as serve_main  # noqa: PLC0415

    serve_main(args)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--json", "as_json", is_flag=True, help="JSON output: {\"matches\": [...]}.")
@click.option("--config", "config_path", default=None, metavar="GUARD.toml",
              help="The guard's config (for extra rule packs).")
@click.option("--all", "show_all", is_flag=True,
              help="List every match, not only the first fatal one.")
@click.option("--argv", "argv_text", default=None, metavar="'ARGS'",
              help="The SGLang command line that failed (or give it after --): name the fix.")
@click.option("--gpu-sm", "gpu_sm", type=int, default=None, metavar="SM",
              help="The GPU's SM (90, 100, ...) for rules that depend on it (default: unknown).")
@click.argument("logfile", type=click.Path(allow_dash=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@guarded
def explain(as_json: bool, config_path: str | None, show_all: bool, argv_text: str | None,
            gpu_sm: int | None, logfile: str, args: tuple[str, ...]) -> None:
    """Run the rule packs over a saved log (a file, or - for stdin): which rule, which fix.

    With the command line (--argv 'ARGS' or -- ARGS) it also names the one flag change the
    guard would make to it, as the supervisor picks it from the whole failure output.
    """
    from sglang_guard.common.termsafe import printable  # noqa: PLC0415
    from sglang_guard.rules.rules import Matcher  # noqa: PLC0415
    from sglang_guard.rules.shell.explain import (  # noqa: PLC0415
        explain_fix,
        explain_log,
        fix_as_dict,
        lead_with,
        matching_lines,
        render_fix,
    )
    from sglang_guard.rules.shell.packs import load_packs  # noqa: PLC0415
    from sglang_guard.sglang.redact import redact_record, redact_text, redact_value  # noqa: PLC0415

    cfg = load_config(config_path, None, None)
    argv = _launch_args([*shlex.split(argv_text or ""), *args])
    with_argv = argv_text is not None or bool(args)
    matcher = Matcher(load_packs(cfg))  # the packs, read and checked once for both uses
    matches = explain_log(logfile, cfg, matcher)  # one streamed pass, bounded memory
    fix = (explain_fix(matching_lines(matches), cfg, argv, sm=gpu_sm, matcher=matcher)
           if with_argv else None)
    matches = lead_with(matches, fix)  # the line shown first is the one the fix comes from
    if as_json:  # log lines are masked like the guard's own output: a log may carry keys
        doc: dict[str, object] = {"matches": [redact_value(m.as_dict()) for m in matches]}
        if with_argv:
            found = fix_as_dict(fix)  # a secret flag's values go whole, as in the journal
            doc["fix"] = None if found is None else redact_record(found)
        click.echo(json.dumps(doc, indent=2))
        return
    if not matches:
        click.echo("no rule matches this log")
    for m in matches if show_all else matches[:1]:  # a log line's ESC/CR shown, not acted
        click.echo(printable(redact_text(m.render())))
    if with_argv:
        click.echo(printable(redact_text(render_fix(fix))))


def _launch_args(words: list[str]) -> list[str]:
    """The launch_server arguments of a pasted command line (as `check` reads it:
    sglang/launcher.py), for `explain`'s flag change."""
    from sglang_guard.sglang.launcher import read_launch  # noqa: PLC0415

    return list(read_launch(words).split()[1])


@main.group()
def rules() -> None:
    """Rule packs: make one from an error dataset."""


@rules.command("import")
@click.option("-o", "--output", default=None, metavar="PACK.toml",
              help="Write the pack here (default: stdout).")
@click.option("--sglang-version", "versions", default=None, metavar="RANGE",
              help="The pack's SGLang release range, e.g. '>=0.5.23,<0.5.24'.")
@click.option("--sglang-src", default=None, metavar="SITE_PACKAGES",
              help="Read the release from an SGLang install: keep only the records whose "
                   "message its source holds.")
@click.option("--name", default=None, help="The pack's name (default: the file's stem).")
@click.argument("dataset", type=click.Path(dir_okay=False))
@guarded
def import_(output: str | None, versions: str | None, sglang_src: str | None,
            name: str | None, dataset: str) -> None:
    """Turn an error dataset (JSONL, schema v2) into a rule pack.

    Exit status: 0 written, 2 bad input (unreadable dataset, unknown schema version, no
    record that gives a rule).
    """
    from sglang_guard.common.outcomes import FixKind  # noqa: PLC0415
    from sglang_guard.common.termsafe import printable  # noqa: PLC0415
    from sglang_guard.rules.shell.importer import import_dataset  # noqa: PLC0415

    outcome = import_dataset(dataset, output=output, versions=versions,
                             sglang_src=sglang_src, name=name)
    for note in outcome.imported.notes:
        click.echo(printable(f"sglang-guard: record {note.record}: {note.problem}"), err=True)
    rules_ = outcome.pack.rules
    advice = sum(r.action == FixKind.ADVICE for r in rules_)
    skipped = sum(n.skipped for n in outcome.imported.notes)
    summary = (f"{len(rules_)} rules ({len(rules_) - advice} with an action, {advice} advice) "
               f"from {outcome.imported.records} records, {skipped} skipped")
    if output is None:
        click.echo(outcome.text, nl=False)  # TOML: every control character is escaped
        click.echo(f"sglang-guard: {summary}", err=True)
    else:
        click.echo(f"sglang-guard: wrote {output}: {summary}", err=True)


# -- fleet memory (fleet/shell/learned.py) ---------------------------------------------------------


def _learned_store(config_path: str | None, store: str | None) -> Any:
    from sglang_guard.fleet.shell.learned import store_for  # noqa: PLC0415

    cfg = load_config(config_path, None, None, search_defaults=True)
    return store_for(cfg.learn, store)


_store_options = [
    click.option("--config", "config_path", default=None, metavar="GUARD.toml",
                 help="The guard config whose [learn] store to read."),
    click.option("--store", default=None, metavar="URL",
                 help="file:///DIR or etcd://HOST:PORT/PREFIX (default: [learn] store)."),
]


def _with_store(fn: F) -> F:
    for option in reversed(_store_options):
        fn = option(fn)
    return fn


@main.group()
def learned() -> None:
    """Fleet memory: the fixes guards learned and share through [learn] store."""


@learned.command("list")
@_with_store
@click.option("--json", "as_json", is_flag=True, help="One JSON array on stdout.")
@guarded
def learned_list(config_path: str | None, store: str | None, as_json: bool) -> None:
    """Every entry: key, proven or known-bad, its edits, origin and confirmations."""
    from sglang_guard.fleet.shell import learned as lib  # noqa: PLC0415

    items = lib.listing(_learned_store(config_path, store))
    if as_json:
        click.echo(json.dumps([lib.as_json(i) for i in items], indent=2))
        return
    for item in items:
        click.echo(lib.line_of(item))


@learned.command("show")
@_with_store
@click.argument("key")
@guarded
def learned_show(config_path: str | None, store: str | None, key: str) -> None:
    """One entry as JSON (KEY: the key or its first 8+ hex digits)."""
    from sglang_guard.fleet.shell import learned as lib  # noqa: PLC0415

    where = _learned_store(config_path, store)
    click.echo(lib.export_entry(lib.entry(where, lib.resolve(where, key))), nl=False)


@learned.command("forget")
@_with_store
@click.argument("key")
@guarded
def learned_forget(config_path: str | None, store: str | None, key: str) -> None:
    """Remove an entry: the next guard with these inputs learns on its own again."""
    from sglang_guard.fleet.shell import learned as lib  # noqa: PLC0415

    where = _learned_store(config_path, store)
    full = lib.resolve(where, key)
    lib.forget(where, full)
    click.echo(f"sglang-guard: forgot {full}", err=True)


@learned.command("export")
@_with_store
@click.option("--as", "fmt", type=click.Choice(["pack", "entry"]), default="pack",
              help="pack: a rule pack (TOML); entry: a file for a file:// store (JSON).")
@click.option("-o", "--output", default=None, metavar="FILE", help="Default: stdout.")
@click.argument("key")
@guarded
def learned_export(config_path: str | None, store: str | None, fmt: str, output: str | None,
                   key: str) -> None:
    """Write an entry as a rule pack or a reviewed store file, to ship with an image."""
    from sglang_guard.common.shell.files import write_atomic  # noqa: PLC0415
    from sglang_guard.fleet.shell import learned as lib  # noqa: PLC0415

    where = _learned_store(config_path, store)
    e = lib.entry(where, lib.resolve(where, key))
    text = lib.export_pack(e) if fmt == "pack" else lib.export_entry(e)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        write_atomic(output, text, mode=0o600 if fmt == "entry" else 0o644)
    except OSError as exc:
        raise click.ClickException(f"{output}: {exc.strerror or exc}") from None
    click.echo(f"sglang-guard: wrote {output}", err=True)
