"""SGLang's option table read from its source: `ServerArgs.add_cli_args` run on a fake parser.

The output has the shape of tools/extract_sglang_options.py's argparse dump (what
sglang/options.py loads), so a table read from a wheel and one dumped from a live parser compare
byte for byte. What cannot be seen statically is listed in `notes` with file:line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from sglang_guard.common.record import record
from sglang_guard.sglang.sgl_ast import (
    ClassRef,
    Evaluator,
    FuncRef,
    Host,
    HostFunc,
    ModuleRef,
    Reader,
    Scope,
    Unknown,
    Unordered,
    call_function,
)

SERVER_ARGS = "sglang.srt.server_args"
NO_DEFAULT: Any = type("NoDefault", (), {"__repr__": lambda self: "NO_DEFAULT"})()
NOT_GIVEN: Any = type("NotGiven", (), {"__repr__": lambda self: "NOT_GIVEN"})()  # no default=
# The `type=` callables whose check the guard repeats (argparse: "invalid int value: 'x'").
_TYPES = ("int", "float")


def _scalar(value: Any) -> Any:
    """A default worth shipping: a JSON scalar (argparse keeps it as is), else NO_DEFAULT."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return NO_DEFAULT


def _type_name(value: Any) -> str | None:
    """"int"/"float" for those builtins as `type=`; None for str, absent or anything else."""
    name = getattr(value, "name", None) or getattr(value, "__name__", None)
    if isinstance(value, str):
        name = value
    return name if name in _TYPES else None

# argparse's action strings and the class each one instantiates.
_ACTIONS = {
    None: "_StoreAction",
    "store": "_StoreAction",
    "store_true": "_StoreTrueAction",
    "store_false": "_StoreFalseAction",
    "store_const": "_StoreConstAction",
    "append": "_AppendAction",
    "append_const": "_AppendConstAction",
    "count": "_CountAction",
    "extend": "_ExtendAction",
    "help": "_HelpAction",
    "version": "_VersionAction",
}
_ZERO_NARGS = {
    "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "_AppendConstAction",
    "_CountAction", "_HelpAction", "_VersionAction", "BooleanOptionalAction",
}


@dataclass(slots=True)
class Registered:
    """One add_argument call as argparse would record it."""

    strings: list[str]
    dest: str
    action: str
    nargs: Any
    choices: list[str] | None
    store_true: bool
    yaml: str
    unordered: bool
    help: str
    where: str  # file:line of the add_argument call or the field
    type: str | None = None  # "int" / "float" for argparse's type check; None: any string
    default: Any = NO_DEFAULT  # a JSON scalar, or NO_DEFAULT where it is not one (or unseen)


@dataclass(slots=True)
class _Parser(Host):
    """The fake argparse parser handed to add_cli_args; groups are the parser itself."""

    reader: OptionReader
    options: list[Registered] = field(default_factory=list)

    def host_attr(self, name: str) -> Any:
        if name == "add_argument":
            return _AddArgument(self)
        if name in ("add_argument_group", "add_mutually_exclusive_group"):
            return _Same(self)
        if name == "set_defaults":
            return _Same(self)
        raise Unknown(f"parser.{name}")


@dataclass(slots=True)
class _Same(HostFunc):
    parser: _Parser

    def host_call(self, scope: Scope, node: ast.Call) -> Any:
        return self.parser


@dataclass(slots=True)
class _AddArgument(HostFunc):
    parser: _Parser

    def host_call(self, scope: Scope, node: ast.Call) -> Any:
        names = [scope.eval(a) for a in node.args]
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        extra: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg is None:  # **kwargs
                extra.update(scope.eval(k.value))

        def get(key: str, default: Any = None) -> Any:
            if key in kw:
                return scope.eval(kw[key])
            return extra.get(key, default)

        where = f"{scope.ev.module(scope.module).path}:{node.lineno}"
        try:
            self._register(scope, names, get, kw, extra=extra, where=where)
        except Unknown as exc:
            raise Unknown(f"{where}: {exc}") from exc
        return None

    def _register(self, scope: Scope, names: list[Any], get: Any, kw: dict[str, ast.expr], *,
                  extra: dict[str, Any], where: str) -> None:
        self.parser.reader.register(
            names, get("action"), nargs=get("nargs"), choices=get("choices"), dest=get("dest"),
            help_text=_help_text(scope, kw.get("help"), extra.get("help")), where=where,
            passed_nargs="nargs" in kw or "nargs" in extra,
            type_name=_ast_type(kw.get("type"), extra.get("type")),
            default=_default(scope, kw.get("default"), extra),
        )


def _ast_type(node: ast.expr | None, fallback: Any) -> str | None:
    """`type=int` / `type=float` as written (a builtin name); anything else: None."""
    if isinstance(node, ast.Name):
        return node.id if node.id in _TYPES else None
    return _type_name(fallback) if node is None and fallback is not None else None


def _default(scope: Scope, node: ast.expr | None, extra: dict[str, Any]) -> Any:
    """The `default=` value when it evaluates to a scalar (argparse's default is None)."""
    if node is None:
        return _scalar(extra["default"]) if "default" in extra else NOT_GIVEN
    try:
        return _scalar(scope.eval(node))
    except Unknown:
        return NO_DEFAULT


def _help_text(scope: Scope, node: ast.expr | None, fallback: Any) -> str:
    if node is None:
        return str(fallback or "")
    try:
        return str(scope.eval(node))
    except Unknown:
        return ast.unparse(node)


class OptionReader:
    """Reads one release's option table out of its source."""

    def __init__(self, read: Reader) -> None:
        self.ev = Evaluator(read)
        self.parser = _Parser(self)
        self.ev.overrides["add_cli_args_from_dataclass"] = _FromDataclass(self)

    # -- argparse's bookkeeping ------------------------------------------------------
    def register(
        self, names: list[Any], action: Any, *, nargs: Any, choices: Any, dest: Any,
        help_text: str, where: str, passed_nargs: bool, type_name: str | None = None,
        default: Any = NOT_GIVEN,
    ) -> None:
        """Record an add_argument call the way argparse builds its Action."""
        strings = [str(n) for n in names]
        kind, base = self._action_class(action)
        if kind == "_HelpAction":
            return
        if kind == "BooleanOptionalAction":
            strings = [
                s2 for s in strings
                for s2 in (s, *(["--no-" + s[2:]] if s.startswith("--") else []))
            ]
        if dest is None:
            longs = [s for s in strings if s.startswith("--")]
            dest = (longs or strings)[0].lstrip("-").replace("-", "_")
        if kind in _ZERO_NARGS or base in _ZERO_NARGS:
            nargs = 0
        elif isinstance(action, ClassRef):
            nargs = self._custom_nargs(action, nargs, passed_nargs)
        store_true = kind == "_StoreTrueAction" or base == "_StoreTrueAction"
        if default is NOT_GIVEN and isinstance(action, ClassRef) and base is None:
            default = NO_DEFAULT  # a custom Action's __init__ may set one: not seen here
        elif default is NOT_GIVEN:  # argparse's own: False for store_true, True for store_false
            store_false = "_StoreFalseAction" in (kind, base)
            default = True if store_false else (False if store_true else None)
        is_store = kind == "_StoreAction" or base == "_StoreAction"
        yaml = (
            "store_true" if store_true
            else ("value" if is_store or nargs is None else "unsupported")
        )
        self.parser.options.append(
            Registered(
                strings=strings,
                dest=str(dest),
                action=kind,
                nargs=nargs,
                choices=None if choices is None else [str(c) for c in choices],
                store_true=store_true,
                yaml=yaml,
                unordered=isinstance(choices, Unordered),
                help=help_text,
                where=where,
                type=None if nargs == 0 else type_name,
                default=default,
            )
        )

    def _action_class(self, action: Any) -> tuple[str, str | None]:
        """(class name, the argparse base it derives from) of an `action=` value."""
        if action is None or isinstance(action, str):
            if action not in _ACTIONS:
                raise Unknown(f"action {action!r}")
            return _ACTIONS[action], None
        if isinstance(action, ModuleRef):
            return action.name.split(".")[-1], None
        if isinstance(action, ClassRef):
            for base in self.ev.base_names(action):
                short = base.split(".")[-1]
                if short in _ACTIONS.values() or short == "BooleanOptionalAction":
                    return action.node.name, short
            return action.node.name, None
        raise Unknown(f"action {action!r}")

    def _custom_nargs(self, cls: ClassRef, passed: Any, was_passed: bool) -> Any:
        """nargs of a custom Action: what its __init__ hands to argparse.Action."""
        init = _method(self.ev, cls, "__init__")
        if init is None:
            return passed
        params = init.node.args
        positional = [a.arg for a in params.args]
        defaults: dict[str, ast.expr] = {}
        if params.defaults:
            defaults = dict(
                zip(positional[-len(params.defaults) :], params.defaults, strict=True)
            )
        defaults.update(
            {a.arg: d for a, d in zip(params.kwonlyargs, params.kw_defaults, strict=True) if d}
        )
        for node in ast.walk(init.node):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__init__"
            ):
                for k in node.keywords:
                    if k.arg == "nargs":
                        if isinstance(k.value, ast.Name) and k.value.id in defaults:
                            if was_passed:
                                return passed
                            return ast.literal_eval(defaults[k.value.id])
                        return ast.literal_eval(k.value)
        return passed

    # -- the whole table -------------------------------------------------------------
    def read(self) -> list[Registered]:
        """Run ServerArgs.add_cli_args against the fake parser."""
        server_args = self.ev.name(SERVER_ARGS, "ServerArgs")
        if not isinstance(server_args, ClassRef):
            # 0.5.20+: the class is rebuilt by msgspec.defstruct; its body is the first binding.
            server_args = _first_class(self.ev, SERVER_ARGS, "ServerArgs")
        func = self.ev.class_attr(server_args, "add_cli_args")
        if not isinstance(func, FuncRef):
            raise Unknown("ServerArgs.add_cli_args is not a function")
        call_function(self.ev, func, [self.parser], {})
        return self.parser.options


def _first_class(ev: Evaluator, module: str, name: str) -> ClassRef:
    for stmt in ev.module(module).binds.get(name, []):
        if isinstance(stmt, ast.ClassDef):
            return ClassRef(module, stmt)
    raise Unknown(f"{module}.{name} is not a class")


def _method(ev: Evaluator, cls: ClassRef, name: str) -> FuncRef | None:
    for stmt in cls.node.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return FuncRef(cls.module, stmt)
    for base in ev.bases(cls):
        if isinstance(base, ClassRef):
            found = _method(ev, base, name)
            if found is not None:
                return found
    return None


# -- dataclass-declared options (0.5.14+) ------------------------------------------------


@record
class _Field:
    name: str
    annotation: ast.expr
    has_default: bool
    module: str
    line: int
    value: ast.expr | None = None


def _class_fields(ev: Evaluator, cls: ClassRef) -> list[_Field]:
    """Annotated fields in dataclass order: bases first, a redefinition keeps its place."""
    out: dict[str, _Field] = {}
    for base in reversed(ev.bases(cls)):
        if isinstance(base, ClassRef):
            for f in _class_fields(ev, base):
                out[f.name] = f
    for stmt in cls.node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = stmt.annotation
            if isinstance(ann, ast.Name) and ann.id == "ClassVar":
                continue
            if isinstance(ann, ast.Subscript) and ast.unparse(ann.value).endswith("ClassVar"):
                continue
            out[stmt.target.id] = _Field(
                stmt.target.id, ann, stmt.value is not None, cls.module, stmt.lineno,
                stmt.value,
            )
    return list(out.values())


def _server_args_fields(ev: Evaluator, cls: ClassRef) -> list[_Field]:
    """ServerArgs' fields: its own (dataclass), or its namespaces' (0.5.20+ defstruct)."""
    mod = ev.module(SERVER_ARGS)
    own = _class_fields(ev, cls)
    if "_INPUT_NAMESPACES" not in mod.binds:
        return own
    namespaces = ev.name(SERVER_ARGS, "_INPUT_NAMESPACES")
    collected: dict[str, _Field] = {}
    for ns in namespaces:
        for f in _class_fields(ev, ns):
            collected.setdefault(f.name, f)
    order = ev.name("sglang.srt.arg_groups.field_order", "POSITIONAL_FIELD_ORDER")
    known = [n for n in order if n in collected]
    rest = [n for n in collected if n not in set(order)]
    merged = {n: collected[n] for n in known + rest}
    for f in own:  # {**_annotations, **ServerArgs.__annotations__}
        merged[f.name] = f
    return list(merged.values())


@dataclass(slots=True)
class _FromDataclass(HostFunc):
    """add_cli_args_from_dataclass(parser, cls) as SGLang's arg_utils.py runs it."""

    reader: OptionReader

    def host_call(self, scope: Scope, node: ast.Call) -> Any:
        cls = scope.eval(node.args[1])
        ev = self.reader.ev
        if not isinstance(cls, ClassRef):
            cls = _first_class(ev, scope.module, "ServerArgs")
        for f in _server_args_fields(ev, cls):
            try:
                self._one(f)
            except Unknown as exc:
                raise Unknown(f"{ev.module(f.module).path}:{f.line} ({f.name}): {exc}") from exc
        return None

    def _one(self, f: _Field) -> None:
        ev = self.reader.ev
        scope = Scope(ev, f.module)
        inner, meta = _unwrap_annotated(f.annotation)
        if meta is None:
            return
        arg: dict[str, Any] = {}
        if isinstance(meta, ast.Constant):
            arg["help"] = meta
        else:
            arg = {k.arg: k.value for k in meta.keywords if k.arg}
            arg["help"] = arg.get("help")

        def get(key: str) -> Any:
            node = arg.get(key)
            return None if node is None else scope.eval(node)

        if get("no_cli"):
            return
        cli_name = get("cli_name") or "--" + f.name.replace("_", "-")
        names = [cli_name, *(get("aliases") or [])]
        auto_dest = cli_name.lstrip("-").replace("-", "_")
        dest = f.name if f.name != auto_dest else None
        where = f"{ev.module(f.module).path}:{f.line}"
        help_text = _help_text(scope, arg.get("help"), "")
        register = self.reader.register
        default = _field_default(scope, f)
        if arg.get("action") is not None:
            kwargs = get("action_kwargs") or {}
            register(
                names, get("action"), nargs=kwargs.get("nargs"), choices=kwargs.get("choices"),
                dest=kwargs.get("dest", dest), help_text=help_text, where=where,
                passed_nargs="nargs" in kwargs, type_name=_type_name(kwargs.get("type")),
                default=default,
            )
            return
        inner, _ = _unwrap_optional(inner)
        literal = _literal_values(inner)
        custom = arg.get("type_parser") is not None  # arg_utils.py: type_parser wins
        common: dict[str, Any] = {"dest": dest, "help_text": help_text, "where": where,
                                  "default": default}
        if literal is not None:
            first = type(literal[0]).__name__ if literal else "str"
            register(names, None, nargs=None, choices=get("choices") or literal,
                     passed_nargs=False, type_name=None if custom else _type_name(first),
                     **common)
            return
        if _is_list(inner) and not custom:
            register(names, None, nargs=get("nargs") or "+", choices=get("choices") or None,
                     passed_nargs=True, type_name=_list_elem(inner), **common)
            return
        if isinstance(inner, ast.Name) and inner.id == "bool":
            register(names, "store_true", nargs=None, choices=None, passed_nargs=False, **common)
            return
        nargs = get("nargs") or None
        scalar = inner.id if isinstance(inner, ast.Name) and not custom else None
        register(names, None, nargs=nargs, choices=get("choices") or None,
                 passed_nargs=nargs is not None, type_name=_type_name(scalar), **common)


def _field_default(scope: Scope, f: _Field) -> Any:
    """The field's default as add_cli_args_from_dataclass passes it (`_field_default`)."""
    node = f.value
    if node is None:
        return NOT_GIVEN  # a required field: argparse's own default
    if isinstance(node, ast.Call):  # field(default=...) / msgspec.field(default=...)
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if "default" not in kw:
            return NO_DEFAULT  # default_factory: a fresh object, never a scalar we need
        node = kw["default"]
    try:
        return _scalar(scope.eval(node))
    except Unknown:
        return NO_DEFAULT


def _list_elem(node: ast.expr) -> str | None:
    parts = _subscript_parts(node)
    if parts is None or not parts[1]:
        return None
    elem = parts[1][0]
    return _type_name(elem.id) if isinstance(elem, ast.Name) else None


def _subscript_parts(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        node = ast.parse(node.value, mode="eval").body
    if not isinstance(node, ast.Subscript):
        return None
    head = ast.unparse(node.value).split(".")[-1]
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return head, list(parts)


def _unwrap_annotated(node: ast.expr) -> tuple[ast.expr, ast.Call | ast.Constant | None]:
    """(inner type, the Arg(...) call or help string) of `A[T, ...]`."""
    parts = _subscript_parts(node)
    if parts is None or parts[0] not in ("A", "Annotated"):
        return node, None
    inner, *meta = parts[1]
    for m in meta:
        if isinstance(m, ast.Call) and ast.unparse(m.func).split(".")[-1] == "Arg":
            return inner, m
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            return inner, m
        if isinstance(m, ast.JoinedStr | ast.BinOp):
            return inner, ast.Constant(ast.unparse(m), lineno=m.lineno, col_offset=0)
    return inner, None


def _unwrap_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) == 1:
            return rest[0], True
    parts = _subscript_parts(node)
    if parts is not None:
        head, args = parts
        if head == "Optional":
            return args[0], True
        if head == "Union":
            rest = [a for a in args if not (isinstance(a, ast.Constant) and a.value is None)]
            if len(rest) == 1:
                return rest[0], True
    return node, False


def _literal_values(node: ast.expr) -> list[Any] | None:
    parts = _subscript_parts(node)
    if parts is None or parts[0] != "Literal":
        return None
    return [ast.literal_eval(a) for a in parts[1]]


def _is_list(node: ast.expr) -> bool:
    parts = _subscript_parts(node)
    if parts is not None:
        return parts[0] in ("list", "List")
    return isinstance(node, ast.Name) and node.id in ("list", "List")


def option_dump(read: Reader, version: str) -> tuple[dict[str, Any], list[Registered]]:
    """The release's option table in the argparse dump's format (plus what was not seen),
    and the registrations with their help text and file:line."""
    reader = OptionReader(read)
    options = reader.read()
    return {
        "sglang_version": version,
        "allow_abbrev": True,
        "options": [
            {
                "strings": o.strings,
                "dest": o.dest,
                "action": o.action,
                "nargs": o.nargs,
                "choices": sorted(o.choices) if o.unordered and o.choices else o.choices,
                "store_true": o.store_true,
                "yaml": o.yaml,
                "type": o.type,
                **({} if o.default is NO_DEFAULT else {"default": o.default}),
            }
            for o in options
        ],
        "unordered_choices": [o.dest for o in options if o.unordered],
        "notes": list(dict.fromkeys(reader.ev.notes)),
    }, options


def deprecations(options: list[Registered]) -> dict[str, str]:
    """Option -> SGLang's deprecation note and where it is, for options still accepted."""
    out = {}
    for o in options:
        if "eprecat" in o.help or o.action.startswith("Deprecated"):
            out[o.strings[0]] = f"{' '.join(o.help.split())[:240]} ({o.where})"
    return out


def release_table(read: Reader, version: str) -> tuple[dict[str, Any], list[Registered]]:
    """Everything shipped for one release: option table, arch lists, deprecations, notes."""
    from sglang_guard.sglang.sgl_arch import arch_lists  # noqa: PLC0415 - one-way dependency

    table, options = option_dump(read, version)
    arch = arch_lists(read)
    arch.pop("lines", None)
    table["arch"] = arch
    table["deprecated"] = deprecations(options)
    return table, options
