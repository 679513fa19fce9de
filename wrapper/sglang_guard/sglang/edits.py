"""Edits to an SGLang command line: drop a flag or set its value, touching nothing else.

Every token that is not part of an edited option stays byte-for-byte. A value that came
from the `--config` YAML is changed in a derived copy of the YAML (the user's file is never
written) and `--config` is pointed at that copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sglang_guard.common.record import record
from sglang_guard.common.sha import sha256
from sglang_guard.sglang.argv import CONFIG_FLAG, CommandLine
from sglang_guard.sglang.options import OptionSpec, OptionTable


@record
class Edit:
    """Drop `dest` everywhere, or make `value` its effective value (None: a bare flag)."""

    dest: str
    kind: Literal["drop", "set"]
    value: str | None = None
    # A drop of an option the release does not have (no dest): its argv tokens
    # (start, count), or its key in the `--config` YAML.
    span: tuple[int, int] | None = None
    yaml_key: str | None = None


@record
class EditResult:
    """The new argv, and the derived YAML (content and path) when the YAML had to change."""

    argv: tuple[str, ...]
    derived_yaml: dict[str, Any] | None
    derived_path: str | None


def dump_yaml(data: Mapping[str, Any]) -> str:
    """Stable YAML text (key order kept) for a derived SGLang config."""
    import yaml  # noqa: PLC0415 - only command lines with --config need it (1 MiB resident)

    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def derived_path_for(data: Mapping[str, Any], derived_dir: str) -> str:
    """A path named by the content's hash: the same edit gives the same path on every node."""
    digest = sha256(dump_yaml(data).encode()).hexdigest()[:12]
    return f"{derived_dir.rstrip('/')}/sglang-config-{digest}.yaml"


def _writer(table: OptionTable, edit: Edit) -> OptionSpec:
    """The option that writes `edit`: for a value, one of its dest that takes a value.

    Several options may share a dest; in 0.5.18 `--cuda-graph-backend-prefill` shares
    `cuda_graph_backend_prefill` with three value-less aliases (`--disable-piecewise-cuda-graph`,
    ...; server_args.py:8797-8820), and the table's own pick for the dest is the last of them.
    """
    spec = table.get(edit.dest)
    if spec is None:
        raise ValueError(f"SGLang {table.sglang_version} has no option storing {edit.dest!r}")
    if edit.value is not None and not spec.takes_value:
        spec = next((o for o in table.options if o.dest == edit.dest and o.takes_value), spec)
    return spec


def apply_edits(
    cl: CommandLine, table: OptionTable, edits: Sequence[Edit], derived_dir: str
) -> EditResult:
    """Apply `edits` (at most one per dest) to `cl`."""
    argv = list(cl.argv)
    remove: set[int] = set()
    replace: dict[int, list[str]] = {}
    append: list[str] = []
    yaml_data = dict(cl.yaml_data) if cl.yaml_data is not None else None
    yaml_changed = False
    for edit in edits:
        if edit.span is not None or edit.yaml_key is not None:  # an option the release lacks
            if edit.span is not None:
                remove.update(range(edit.span[0], edit.span[0] + edit.span[1]))
            if edit.yaml_key is not None and yaml_data is not None \
                    and edit.yaml_key in yaml_data:
                del yaml_data[edit.yaml_key]
                yaml_changed = True
            continue
        occs = [o for o in cl.occurrences if o.spec is not None and o.spec.dest == edit.dest]
        if edit.kind == "drop":
            for occ in occs:
                if occ.origin == "cli":
                    remove.update(range(occ.index, occ.index + occ.count))
                elif yaml_data is not None and occ.yaml_key in yaml_data:
                    del yaml_data[occ.yaml_key]
                    yaml_changed = True
            continue
        spec = _writer(table, edit)
        last = occs[-1] if occs else None
        # A value-less alias of the dest (store_const) cannot carry the value: replace it.
        alias = (last is not None and last.origin == "cli" and last.spec is not None
                 and edit.value is not None and not last.spec.takes_value)
        if last is None:
            append += [spec.canonical] + ([edit.value] if edit.value is not None else [])
        elif last.origin == "yaml" and yaml_data is not None and last.yaml_key is not None:
            # (no alias here: SGLang's YAML merge refuses store_const options)
            yaml_data[last.yaml_key] = True if edit.value is None else edit.value
            yaml_changed = True
        elif alias:
            replace[last.index] = [spec.canonical, str(edit.value)]
            remove.update(range(last.index + 1, last.index + last.count))
        elif edit.value is not None and last.inline:
            replace[last.index] = [f"{last.option}={edit.value}"]
        elif edit.value is not None:
            replace[last.index] = [argv[last.index], edit.value]
            remove.update(range(last.index + 1, last.index + last.count))
    derived_path = None
    if yaml_changed and yaml_data is not None:
        derived_path = derived_path_for(yaml_data, derived_dir)
        replace[argv.index(CONFIG_FLAG) + 1] = [derived_path]
    out: list[str] = []
    for i, tok in enumerate(argv):
        if i in replace:
            out += replace[i]
        elif i not in remove:
            out.append(tok)
    return EditResult(tuple(out + append), yaml_data if yaml_changed else None, derived_path)
