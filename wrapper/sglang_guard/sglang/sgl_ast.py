"""A tiny static evaluator over SGLang's source: module constants without importing SGLang.

It reads modules through a `read(path) -> text | None` callable (a wheel, a site-packages
directory, a dict in tests), so it does no I/O of its own. It evaluates the expressions SGLang
uses for its option tables (literals, names across `from x import y`, `+`, `list()`,
comprehensions, dict keys, enum members, class attributes); anything else raises `Unknown`,
and callers record what they could not see instead of guessing.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sglang_guard.common.record import record

Reader = Callable[[str], str | None]


class Unknown(Exception):
    """An expression the evaluator cannot compute statically."""


@record
class ModuleRef:
    """An imported module."""

    name: str


@record
class ClassRef:
    """A class defined in SGLang's source."""

    module: str
    node: ast.ClassDef


@record
class FuncRef:
    """A function defined in SGLang's source (a module function or a method)."""

    module: str
    node: ast.FunctionDef


@record
class EnumMember:
    """A member of an Enum class, as `.name` / `.value` see it."""

    name: str
    value: Any


class Host:
    """A Python object the evaluated code may use (the fake argparse parser)."""

    def host_attr(self, name: str) -> Any:
        """The attribute `name`, usually a HostFunc."""
        raise Unknown(f"attribute .{name}")


class HostFunc:
    """A callable that sees the call's syntax, so that it can evaluate arguments lazily."""

    def host_call(self, scope: Scope, node: ast.Call) -> Any:
        """Perform the call."""
        raise NotImplementedError


class Unordered(list[Any]):
    """A list built from a set: its order is Python's hash order, not SGLang's."""


@dataclass(slots=True)
class Module:
    """One parsed module: its top-level statements by the name they bind."""

    name: str
    path: str
    tree: ast.Module
    binds: dict[str, list[ast.stmt]] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)  # modules of `from x import *`
    skipped: dict[str, str] = field(default_factory=dict)  # name -> the `if` not taken


def _bound_names(stmt: ast.stmt) -> Iterator[str]:
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                yield target.id
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign) and isinstance(stmt.target, ast.Name):
        yield stmt.target.id
    elif isinstance(stmt, ast.ImportFrom | ast.Import):
        for alias in stmt.names:
            yield (alias.asname or alias.name).split(".")[0]
    elif isinstance(stmt, ast.ClassDef | ast.FunctionDef):
        yield stmt.name
    elif (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and isinstance(stmt.value.func.value, ast.Name)
        and stmt.value.func.attr in ("append", "extend", "update", "add")
    ):
        yield stmt.value.func.value.id


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, looking into `try:` bodies; an `if` is read as false (the default
    environment: no env var set, no plugin loaded), so only its `else:` counts."""
    for stmt in body:
        if isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
        elif isinstance(stmt, ast.If):
            yield from _top_level(stmt.orelse)
        else:
            yield stmt


class Evaluator:
    """Evaluates names and expressions in SGLang's modules, reading them on demand."""

    def __init__(self, read: Reader, package: str = "sglang") -> None:
        self._read = read
        self._modules: dict[str, Module | None] = {}
        self._classes: dict[tuple[str, int, str], Any] = {}
        self.package = package
        self.notes: list[str] = []
        # SGLang functions the caller models itself, by name (add_cli_args_from_dataclass).
        self.overrides: dict[str, HostFunc] = {}

    # -- modules ---------------------------------------------------------------------
    def module(self, name: str) -> Module:
        """The parsed module `name`; Unknown when it is not in the source."""
        if name not in self._modules:
            self._modules[name] = self._load(name)
        mod = self._modules[name]
        if mod is None:
            raise Unknown(f"module {name} not in the source")
        return mod

    def _load(self, name: str) -> Module | None:
        base = name.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            text = self._read(path)
            if text is not None:
                tree = _parse(text, path)
                mod = Module(name, path, tree)
                for top in tree.body:
                    if isinstance(top, ast.If):
                        for inner in ast.walk(top):
                            if isinstance(inner, ast.stmt) and inner is not top:
                                for bound in _bound_names(inner):
                                    mod.skipped.setdefault(
                                        bound, f"{path}:{top.lineno}: `if {ast.unparse(top.test)}`"
                                    )
                for stmt in _top_level(tree.body):
                    if isinstance(stmt, ast.ImportFrom) and stmt.names[0].name == "*":
                        mod.stars.append(self.resolve_from(mod, stmt))
                    for bound in _bound_names(stmt):
                        mod.binds.setdefault(bound, []).append(stmt)
                return mod
        return None

    def has_module(self, name: str) -> bool:
        """Whether the source holds module `name`."""
        try:
            self.module(name)
        except Unknown:
            return False
        return True

    def resolve_from(self, mod: Module, node: ast.ImportFrom) -> str:
        """The absolute module name of a `from ... import` in `mod`."""
        if not node.level:
            return node.module or ""
        parts = mod.name.split(".")
        is_pkg = mod.path.endswith("__init__.py")
        base = parts if is_pkg else parts[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join([*base, node.module] if node.module else base)

    # -- names -----------------------------------------------------------------------
    def name(self, module: str, name: str) -> Any:
        """The value module-level `name` has once `module` has been imported."""
        mod = self.module(module)
        if name in mod.cache:
            if mod.cache[name] is _BUSY:
                raise Unknown(f"{module}.{name} refers to itself")
            return mod.cache[name]
        stmts = mod.binds.get(name)
        if not stmts:
            for star in mod.stars:
                if self.has_module(star) and name in self.module(star).binds:
                    return self.name(star, name)
            raise Unknown(f"{module}.{name} is not defined")
        if name in mod.skipped:
            self.notes.append(f"{mod.skipped[name]} not known statically; read as false")
        value: Any = _UNSET
        mod.cache[name] = _BUSY
        try:
            for stmt in stmts:
                value = self._apply(mod, stmt, name, value)
        finally:
            del mod.cache[name]
        if value is _UNSET:
            raise Unknown(f"{module}.{name} has no value")
        mod.cache[name] = value
        return value

    def _apply(self, mod: Module, stmt: ast.stmt, name: str, value: Any) -> Any:
        if isinstance(stmt, ast.ImportFrom):
            target = self.resolve_from(mod, stmt)
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    if self.has_module(f"{target}.{alias.name}"):
                        return ModuleRef(f"{target}.{alias.name}")
                    if not target.startswith(self.package):
                        return ModuleRef(f"{target}.{alias.name}")
                    return self.name(target, alias.name)
            return value
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bound = alias.asname or alias.name.split(".")[0]
                if bound == name:
                    return ModuleRef(alias.name if alias.asname else bound)
            return value
        if isinstance(stmt, ast.ClassDef):
            return ClassRef(mod.name, stmt)
        if isinstance(stmt, ast.FunctionDef):
            return FuncRef(mod.name, stmt)
        scope = Scope(self, mod.name)
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            if stmt.value is None:
                return value
            try:
                return scope.eval(stmt.value)
            except Unknown:
                if value is _UNSET:
                    raise
                return value  # a later rebinding we cannot follow: keep the first
        if isinstance(stmt, ast.AugAssign):
            if value is _UNSET or not isinstance(stmt.op, ast.Add):
                raise Unknown(f"{mod.name}.{name}: augmented assignment")
            return value + scope.eval(stmt.value)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            scope.locals[name] = value
            scope.eval(stmt.value)
            return scope.locals[name]
        return value

    # -- classes ---------------------------------------------------------------------
    def class_attr(self, cls: ClassRef, attr: str) -> Any:
        """A class-body binding (or method) `attr` of `cls`, searching its bases."""
        key = (cls.module, cls.node.lineno, attr)
        if key in self._classes:
            value = self._classes[key]
            if isinstance(value, Unknown):
                raise value
            return value
        for i, stmt in enumerate(cls.node.body):
            if isinstance(stmt, ast.FunctionDef) and stmt.name == attr:
                return FuncRef(cls.module, stmt)
            if (
                isinstance(stmt, ast.Assign | ast.AnnAssign)
                and stmt.value is not None
                and attr in _bound_names(stmt)
            ):
                try:
                    value = _ClassScope(self, cls, i).eval(stmt.value)
                    if self.is_enum(cls):
                        value = EnumMember(attr, value)
                except Unknown as exc:
                    value = exc
                self._classes[key] = value
                if isinstance(value, Unknown):
                    raise value
                return value
        for base in self.bases(cls):
            if isinstance(base, ClassRef):
                return self.class_attr(base, attr)
        raise Unknown(f"{cls.node.name}.{attr}")

    def bases(self, cls: ClassRef) -> list[Any]:
        """The evaluated base classes of `cls` (ModuleRef for classes outside SGLang)."""
        out: list[Any] = []
        for base in cls.node.bases:
            try:
                out.append(Scope(self, cls.module).eval(base))
            except Unknown:
                out.append(ModuleRef(ast.unparse(base)))
        return out

    def base_names(self, cls: ClassRef) -> list[str]:
        """Dotted names of every ancestor, SGLang's own classes by their class name."""
        names: list[str] = []
        for base in self.bases(cls):
            if isinstance(base, ClassRef):
                names.append(base.node.name)
                names.extend(self.base_names(base))
            elif isinstance(base, ModuleRef):
                names.append(base.name)
        return names

    def is_enum(self, cls: ClassRef) -> bool:
        """Whether `cls` derives from enum.Enum (or IntEnum, StrEnum)."""
        return any(n.split(".")[-1] in ("Enum", "IntEnum", "StrEnum") for n in self.base_names(cls))

    def enum_members(self, cls: ClassRef) -> list[EnumMember]:
        """The members of an Enum class in definition order."""
        out = []
        for stmt in cls.node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    out.append(EnumMember(target.id, _literal_or_none(stmt.value)))
        return out


@functools.lru_cache(maxsize=256)
def _parse(text: str, path: str) -> ast.Module:
    """Parsed once per distinct file: consecutive releases share most of their modules, and
    the trees are only read, never changed."""
    return ast.parse(text, filename=path)


_UNSET = object()
_BUSY = object()


def _literal_or_none(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


class Scope:
    """Evaluates expressions with a module's globals and some locals."""

    def __init__(self, ev: Evaluator, module: str, local: dict[str, Any] | None = None) -> None:
        self.ev = ev
        self.module = module
        self.locals: dict[str, Any] = dict(local or {})

    def lookup(self, name: str) -> Any:
        """A local, else a module global, else a builtin we model."""
        if name in self.locals:
            value = self.locals[name]
            if isinstance(value, Unknown):
                raise value
            return value
        try:
            return self.ev.name(self.module, name)
        except Unknown:
            if name in _BUILTINS:
                return _BUILTINS[name]
            raise

    def eval(self, node: ast.expr) -> Any:
        """Evaluate `node`; Unknown when it needs anything the evaluator does not model."""
        method = getattr(self, f"_e_{type(node).__name__}", None)
        if method is None:
            raise Unknown(f"line {getattr(node, 'lineno', 0)}: {type(node).__name__}")
        return method(node)

    def _e_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _e_List(self, node: ast.List) -> Any:
        return self._elements(node.elts)

    def _e_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self._elements(node.elts))

    def _e_Set(self, node: ast.Set) -> Any:
        return Unordered(dict.fromkeys(self._elements(node.elts)))

    def _elements(self, elts: list[ast.expr]) -> list[Any]:
        out: list[Any] = []
        for elt in elts:
            if isinstance(elt, ast.Starred):
                out.extend(self.eval(elt.value))
            else:
                out.append(self.eval(elt))
        return out

    def _e_Dict(self, node: ast.Dict) -> Any:
        out: dict[Any, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                out.update(self.eval(value))
            else:
                out[self.eval(key)] = self.eval(value)
        return out

    def _e_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id)

    def _e_JoinedStr(self, node: ast.JoinedStr) -> Any:
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append(str(self.eval(value.value)))
        return "".join(parts)

    def _e_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.eval(node.left), self.eval(node.right)
        if isinstance(node.op, ast.Add):
            if isinstance(left, list) and isinstance(right, tuple):
                right = list(right)
            return left + right
        if isinstance(node.op, ast.BitOr) and isinstance(left, dict):
            return {**left, **right}
        if isinstance(node.op, ast.Mod) and isinstance(left, str):
            return left % right
        raise Unknown(f"line {node.lineno}: operator {type(node.op).__name__}")

    def _e_Attribute(self, node: ast.Attribute) -> Any:
        base = self.eval(node.value)
        attr = node.attr
        if isinstance(base, Host):
            return base.host_attr(attr)
        if isinstance(base, ModuleRef):
            if self.ev.has_module(base.name):
                if self.ev.has_module(f"{base.name}.{attr}"):
                    return ModuleRef(f"{base.name}.{attr}")
                return self.ev.name(base.name, attr)
            return ModuleRef(f"{base.name}.{attr}")
        if isinstance(base, ClassRef):
            return self.ev.class_attr(base, attr)
        if isinstance(base, EnumMember):
            if attr == "name":
                return base.name
            if attr == "value":
                return base.value
        if isinstance(base, str | dict | list) and attr in _METHODS:
            return _Bound(base, attr)
        raise Unknown(f"line {node.lineno}: attribute .{attr}")

    def _e_Call(self, node: ast.Call) -> Any:
        func = self.eval(node.func)
        if isinstance(func, HostFunc):
            return func.host_call(self, node)
        if isinstance(func, FuncRef) and func.node.name in self.ev.overrides:
            return self.ev.overrides[func.node.name].host_call(self, node)
        args = self._elements(node.args)
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg}
        if isinstance(func, _Bound):
            return func(*args)
        if callable(func) and func in _BUILTINS.values():
            args = [
                self.ev.enum_members(a) if isinstance(a, ClassRef) and self.ev.is_enum(a) else a
                for a in args
            ]
            return func(*args, **kwargs)
        if isinstance(func, FuncRef):
            return call_function(self.ev, func, args, kwargs)
        raise Unknown(f"line {node.lineno}: call of {ast.unparse(node.func)}")

    def _comprehension(self, gens: list[ast.comprehension], emit: Callable[[Scope], None]) -> None:
        def loop(i: int, scope: Scope) -> None:
            if i == len(gens):
                emit(scope)
                return
            gen = gens[i]
            for item in _iterate(self.ev, scope.eval(gen.iter)):
                inner = Scope(self.ev, self.module, scope.locals)
                _bind(inner, gen.target, item)
                if all(inner.eval(cond) for cond in gen.ifs):
                    loop(i + 1, inner)

        loop(0, self)

    def _e_ListComp(self, node: ast.ListComp) -> Any:
        out: list[Any] = []
        self._comprehension(node.generators, lambda s: out.append(s.eval(node.elt)))
        return out

    def _e_SetComp(self, node: ast.SetComp) -> Any:
        out: list[Any] = []
        self._comprehension(node.generators, lambda s: out.append(s.eval(node.elt)))
        return Unordered(dict.fromkeys(out))

    def _e_DictComp(self, node: ast.DictComp) -> Any:
        out: dict[Any, Any] = {}

        def emit(s: Scope) -> None:
            out[s.eval(node.key)] = s.eval(node.value)

        self._comprehension(node.generators, emit)
        return out

    def _e_Compare(self, node: ast.Compare) -> Any:
        left = self.eval(node.left)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.eval(comp)
            if isinstance(op, ast.Eq):
                ok = left == right
            elif isinstance(op, ast.NotEq):
                ok = left != right
            elif isinstance(op, ast.In):
                ok = left in right
            elif isinstance(op, ast.NotIn):
                ok = left not in right
            elif isinstance(op, ast.Is):
                ok = left is right
            elif isinstance(op, ast.IsNot):
                ok = left is not right
            else:
                raise Unknown(f"line {node.lineno}: comparison")
            if not ok:
                return False
            left = right
        return True

    def _e_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.eval(v) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)

    def _e_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.eval(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        if isinstance(node.op, ast.USub):
            return -value
        raise Unknown(f"line {node.lineno}: unary operator")

    def _e_Subscript(self, node: ast.Subscript) -> Any:
        base = self.eval(node.value)
        if isinstance(base, list | tuple | dict | str):
            return base[self.eval(node.slice)]
        raise Unknown(f"line {node.lineno}: subscript")

    def _e_Slice(self, node: ast.Slice) -> Any:
        def part(n: ast.expr | None) -> Any:
            return None if n is None else self.eval(n)

        return slice(part(node.lower), part(node.upper), part(node.step))


class _ClassScope(Scope):
    """A class body's scope: names bound earlier in the body, then the module's."""

    def __init__(self, ev: Evaluator, cls: ClassRef, before: int) -> None:
        super().__init__(ev, cls.module)
        self.cls = cls
        self.before = before

    def lookup(self, name: str) -> Any:
        for stmt in self.cls.node.body[: self.before]:
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and name in _bound_names(stmt):
                return self.ev.class_attr(self.cls, name)
        return super().lookup(name)


@record
class _Bound:
    obj: Any
    method: str

    def __call__(self, *args: Any) -> Any:
        result = self._call(*args)
        if self.method in ("keys", "values", "items"):
            return list(result)
        if self.method in ("append", "extend", "update", "add"):
            return None
        return result

    def _call(self, *args: Any) -> Any:
        if self.method == "add" and isinstance(self.obj, list):
            if args[0] not in self.obj:
                self.obj.append(args[0])
            return None
        return getattr(self.obj, self.method)(*args)


_METHODS = frozenset(
    {"keys", "values", "items", "lower", "upper", "replace", "strip", "split", "join", "get",
     "append", "extend", "update", "add", "format", "startswith", "endswith", "copy"}
)


def _sorted(items: Any, **kwargs: Any) -> list[Any]:
    if kwargs:
        raise Unknown("sorted() with a key")
    return sorted(_iterate(None, items))


_BUILTINS: dict[str, Any] = {
    "list": lambda x=(): list(_iterate(None, x)),
    "tuple": lambda x=(): tuple(_iterate(None, x)),
    "set": lambda x=(): Unordered(dict.fromkeys(_iterate(None, x))),
    "frozenset": lambda x=(): Unordered(dict.fromkeys(_iterate(None, x))),
    "sorted": _sorted,
    "dict": dict,
    "str": str,
    "len": len,
    "None": None,
    "True": True,
    "False": False,
}


def _iterate(ev: Evaluator | None, value: Any) -> list[Any]:
    if isinstance(value, ClassRef) and ev is not None and ev.is_enum(value):
        return list(ev.enum_members(value))
    if isinstance(value, list | tuple | str):
        return list(value)
    if isinstance(value, dict):
        return list(value)
    raise Unknown(f"cannot iterate over {type(value).__name__}")


def _bind(scope: Scope, target: ast.expr, value: Any) -> None:
    if isinstance(value, Unknown) and not isinstance(target, ast.Name):
        raise value
    if isinstance(target, ast.Name):
        scope.locals[target.id] = value
    elif isinstance(target, ast.Tuple | ast.List):
        for t, v in zip(target.elts, value, strict=True):
            _bind(scope, t, v)
    else:
        raise Unknown("assignment target")


def call_function(
    ev: Evaluator, func: FuncRef, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """Run a small SGLang function body: imports, assignments, `if` on what it can see, return."""
    params = func.node.args
    names = [a.arg for a in params.posonlyargs + params.args]
    local: dict[str, Any] = dict(zip(names, args, strict=False))
    local.update(kwargs)
    scope = Scope(ev, func.module, local)
    return run_body(ev, scope, func.node.body)


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


def run_body(ev: Evaluator, scope: Scope, body: list[ast.stmt]) -> Any:
    """Execute `body`; an `if` whose test is unknown is taken as false (the default path)."""
    try:
        _exec(ev, scope, body)
    except _Return as ret:
        return ret.value
    return None


def _exec(ev: Evaluator, scope: Scope, body: list[ast.stmt]) -> None:
    mod = ev.module(scope.module)
    for stmt in body:
        if isinstance(stmt, ast.Return):
            raise _Return(None if stmt.value is None else scope.eval(stmt.value))
        if isinstance(stmt, ast.ImportFrom):
            target = ev.resolve_from(mod, stmt)
            for alias in stmt.names:
                bound = alias.asname or alias.name
                try:
                    scope.locals[bound] = ev.name(target, alias.name)
                except Unknown:
                    scope.locals[bound] = ModuleRef(f"{target}.{alias.name}")
        elif isinstance(stmt, ast.Assign):
            try:
                value = scope.eval(stmt.value)
            except Unknown as exc:
                value = exc  # fails only if it is read
            for lhs in stmt.targets:
                _bind(scope, lhs, value)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            _bind(scope, stmt.target, scope.eval(stmt.value))
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            scope.locals[name] = scope.lookup(name) + scope.eval(stmt.value)
        elif isinstance(stmt, ast.If):
            try:
                taken = bool(scope.eval(stmt.test))
            except Unknown:
                ev.notes.append(
                    f"{mod.path}:{stmt.lineno}: `if {ast.unparse(stmt.test)}` not known "
                    "statically; read as false"
                )
                taken = False
            _exec(ev, scope, stmt.body if taken else stmt.orelse)
        elif isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Call):
                scope.eval(stmt.value)
        elif isinstance(stmt, ast.Try | ast.With):
            _exec(ev, scope, stmt.body)
        elif isinstance(stmt, ast.For):
            for item in _iterate(ev, scope.eval(stmt.iter)):
                _bind(scope, stmt.target, item)
                _exec(ev, scope, stmt.body)
        elif isinstance(stmt, ast.Pass | ast.Assert | ast.FunctionDef):
            continue
        else:
            raise Unknown(f"{mod.path}:{stmt.lineno}: statement {type(stmt).__name__}")
