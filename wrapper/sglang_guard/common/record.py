"""`@record`: `@dataclass(frozen=True, slots=True)`, made at under a third of the cost.

For each frozen dataclass the stdlib compiles six methods from source (`dataclasses._create_fn`,
one `exec` each): ~0.9 ms a class on a 2-core VM, and the 47 a cached `check` imports were
~40 ms of its ~110 (issue 24: cached <= 0.1 s). `record` has dataclasses read the fields and
make the slotted class with no method of its own (`init=False, repr=False, eq=False`, which
compiles nothing), then makes one `__init__` (the stdlib's, frozen: `object.__setattr__`
per field, default factories, `__post_init__`) from code compiled once per shape of field
list (`_shape_code`), and makes `__setattr__`, `__delattr__`, `__repr__`, `__eq__` and
`__hash__` as closures over the fields' names. What it makes is what
`@dataclass(frozen=True, slots=True, kw_only=..., eq=...)` makes, as `dataclasses` sees it
(`fields`, `replace`, `asdict`, `__match_args__`, `__dataclass_params__`, pickling), and its
methods answer as the stdlib's do: tests/unit/test_record.py holds the two to each other over
random field lists (flags, defaults, factories, kw_only, methods of the class's own) and over
every record of the package. What it does not take on (`_plain`: an `InitVar` or `ClassVar`,
a field `init=False` or named `self`, a mutable default, defaults out of order, a dataclass
base, a body's own `__init__`, `__setattr__` or `__delattr__`) it hands to the stdlib whole:
same class, the stdlib's cost, the stdlib's errors. Mutable dataclasses keep `@dataclass`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from operator import attrgetter
from reprlib import recursive_repr
from types import CodeType, FunctionType
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")


class _Factory:
    """The default an `__init__` shows for a field with a default factory (as the stdlib's)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, kw_only: bool = False, eq: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T] | None = None, /, *, kw_only: bool = False,
           eq: bool = True) -> type[T] | Callable[[type[T]], type[T]]:
    """A frozen, slotted dataclass of `cls` (`kw_only` and `eq` as `dataclass` reads them)."""
    if cls is None:
        return lambda c: _make(c, kw_only, eq)
    return _make(cls, kw_only, eq)


def _make(cls: type[T], kw_only: bool, eq: bool) -> type[T]:
    if not _plain(cls, kw_only):  # the stdlib's own class, or its own error
        return dataclasses.dataclass(cls, frozen=True, slots=True, kw_only=kw_only, eq=eq)
    documented = bool(cls.__dict__.get("__doc__"))
    made = dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=True,
                                 kw_only=kw_only)
    params: Any = getattr(made, "__dataclass_params__")  # noqa: B009 - not in type stubs
    params.init = params.repr = params.frozen = True
    params.eq = eq
    fields = dataclasses.fields(made)  # type: ignore[arg-type]
    own = made.__dict__
    _method(made, "__init__", _init(made, fields))
    if not documented:  # the stdlib's doc for a class without one, with this __init__
        made.__doc__ = made.__name__ + _signature(made)
    names = tuple(f.name for f in fields)
    frozen = frozenset(names)
    _method(made, "__setattr__", _setattr(made, frozen))
    _method(made, "__delattr__", _delattr(made, frozen))
    if "__getstate__" not in own:
        _method(made, "__getstate__", _getstate(names))
    if "__setstate__" not in own:
        _method(made, "__setstate__", _setstate(names))
    if "__repr__" not in own:
        _method(made, "__repr__", _repr(tuple(f.name for f in fields if f.repr)))
    if not eq:
        return made
    if "__eq__" not in own:
        _method(made, "__eq__", _eq(tuple(f.name for f in fields if f.compare)))
    # the stdlib's _hash_action for frozen and eq: its own __hash__ unless the class body
    # defines one (a body with __eq__ alone has __hash__ None, which does not count)
    body_hash = own.get("__hash__", dataclasses.MISSING)
    if body_hash is dataclasses.MISSING or (body_hash is None and "__eq__" in own):
        hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        _method(made, "__hash__", _hash(_key(hashed)))
    return made


# An annotation naming one of these is no plain field (dataclasses' _is_classvar,
# _is_initvar and _is_kw_only read these words): the stdlib makes such a class.
_NOT_PLAIN = ("ClassVar", "InitVar", "KW_ONLY")


def _plain(cls: type, kw_only: bool) -> bool:
    """Whether `_make` makes `cls` itself, told from the body before dataclasses touches it
    (it rewrites the body's defaults): every annotation text (`from __future__ import
    annotations`) naming no ClassVar, InitVar or KW_ONLY; no field named self; every field
    in `__init__`, none with a mutable default, no positional one without a default after
    one with; no `__init__`, `__setattr__` or `__delattr__` of the body's own; no dataclass
    base."""
    own = cls.__dict__
    if "__setattr__" in own or "__delattr__" in own or "__init__" in own or any(
            hasattr(base, "__dataclass_fields__") for base in cls.__mro__[1:]):
        return False
    seen_default = False
    for name, kind in own.get("__annotations__", {}).items():
        if not isinstance(kind, str) or any(word in kind for word in _NOT_PLAIN):
            return False
        if name == "self":  # the stdlib renames __init__'s own first parameter
            return False
        value = own.get(name, dataclasses.MISSING)
        keyword = kw_only
        if isinstance(value, dataclasses.Field):
            if not value.init:
                return False
            if value.kw_only is not dataclasses.MISSING:
                keyword = bool(value.kw_only)
            value = value.default if value.default_factory is dataclasses.MISSING else None
        if value is not dataclasses.MISSING and value.__class__.__hash__ is None:
            return False  # the stdlib's ValueError (a mutable default)
        if keyword:
            continue
        if seen_default and value is dataclasses.MISSING:
            return False  # the stdlib's TypeError
        seen_default = value is not dataclasses.MISSING
    return True


def _method(cls: type, name: str, fn: Callable[..., Any]) -> None:
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, fn)


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """The stdlib's frozen `__init__` for `fields`: the code of its shape (`_shape_code`)
    with the fields' names put in, the defaults and factories given to the function."""
    ns: dict[str, Any] = {"__name__": cls.__module__, "__set": object.__setattr__,
                          "__FACTORY": _FACTORY}
    kinds: list[tuple[int, bool]] = []
    positional: list[Any] = []
    keyword: dict[str, Any] = {}
    for i, f in enumerate(fields):
        if f.default_factory is not dataclasses.MISSING:
            kind, default = 2, _FACTORY
            ns[f"__f{i}"] = f.default_factory
        elif f.default is not dataclasses.MISSING:
            kind, default = 1, f.default
        else:
            kind, default = 0, None
        kinds.append((kind, bool(f.kw_only)))
        if kind and f.kw_only:
            keyword[f.name] = default
        elif kind:
            positional.append(default)
    code = _shape_code((tuple(kinds), hasattr(cls, "__post_init__")))
    names = tuple(f.name for f in fields)
    consts = tuple(names[int(c[2:])] if isinstance(c, str) and c.startswith("\0p") else c
                   for c in code.co_consts)
    # the parameters in the code's order: the positional fields, then the keyword-only ones
    order = [f.name for f in fields if not f.kw_only] + [f.name for f in fields if f.kw_only]
    init: Callable[..., None] = FunctionType(
        code.replace(co_varnames=("self", *order), co_consts=consts), ns, "__init__",
        tuple(positional) or None)
    init.__kwdefaults__ = keyword or None
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    return init


# The code of one __init__ shape: each field's kind (0 plain, 1 default, 2 factory) and
# whether it is keyword-only, and whether the class has __post_init__. Field i is parameter
# p<i>, its attribute name the constant "\0p<i>" (no other constant of the code reads so) and
# its default factory the global __f<i>; `_init` puts the fields' names in
# (CodeType.replace) and the defaults on the function: ~8 us a class, against ~110 us
# compiling each class's own text (a record made ~160 -> ~80 us).
_SHAPES: dict[tuple[tuple[tuple[int, bool], ...], bool], CodeType] = {}


def _shape_code(shape: tuple[tuple[tuple[int, bool], ...], bool]) -> CodeType:
    code = _SHAPES.get(shape)
    if code is not None:
        return code
    kinds, post_init = shape
    params, kw, body = ["self"], list[str](), list[str]()
    for i, (kind, kw_only) in enumerate(kinds):
        param = f"p{i}"
        value = f"__f{i}() if {param} is __FACTORY else {param}" if kind == 2 else param
        # a default's value is the function's, not the code's: any one stands in for it
        (kw if kw_only else params).append(param if kind == 0 else f"{param}=None")
        body.append(f" __set(self,'\\0{param}',{value})")
    if post_init:
        body.append(" self.__post_init__()")
    if kw:
        params += ["*", *kw]
    ns: dict[str, Any] = {}
    exec(f"def __init__({', '.join(params)}):\n" + ("\n".join(body) or " pass"), ns)  # noqa: S102 - text made here from a shape's numbers
    made: CodeType = ns["__init__"].__code__
    _SHAPES[shape] = made
    return made


def _signature(cls: type) -> str:
    import inspect  # noqa: PLC0415 - loaded with dataclasses; only an undocumented class

    try:
        return str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):  # pragma: no cover - the stdlib's guard
        return ""


def _setattr(cls: type, names: frozenset[str]) -> Callable[[object, str, Any], None]:
    def __setattr__(self: object, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[arg-type]

    return __setattr__


def _delattr(cls: type, names: frozenset[str]) -> Callable[[object, str], None]:
    def __delattr__(self: object, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[arg-type]

    return __delattr__


def _getstate(names: tuple[str, ...]) -> Callable[[object], list[Any]]:
    def __getstate__(self: object) -> list[Any]:
        return [getattr(self, name) for name in names]

    return __getstate__


def _setstate(names: tuple[str, ...]) -> Callable[[object, list[Any]], None]:
    def __setstate__(self: object, state: list[Any]) -> None:
        for name, value in zip(names, state, strict=False):
            object.__setattr__(self, name, value)

    return __setstate__


def _key(names: tuple[str, ...]) -> Callable[[object], tuple[Any, ...]]:
    """The tuple of an instance's `names`, as the stdlib's methods build it."""
    if len(names) >= 2:  # attrgetter of two or more names gives a tuple
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _repr(names: tuple[str, ...]) -> Callable[[object], str]:
    @recursive_repr("...")
    def __repr__(self: object) -> str:
        shown = ", ".join([f"{name}={getattr(self, name)!r}" for name in names])
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _eq(names: tuple[str, ...]) -> Callable[[object, object], Any]:
    """The stdlib's `__eq__` over `names`: the two tuples compared (3.11, 3.12), or, from
    3.13, the instance itself equal and the fields compared in turn (`a == b and ...`, so
    a field equal to itself only by identity, a NaN, no longer makes the records equal)."""
    if sys.version_info < (3, 13):
        key = _key(names)

        def __eq__(self: object, other: object) -> Any:
            if other.__class__ is self.__class__:
                return key(self) == key(other)
            return NotImplemented

        return __eq__
    getters = tuple(attrgetter(name) for name in names)

    def __eq__(self: object, other: object) -> Any:  # type: ignore[no-redef]
        if self is other:
            return True
        if other.__class__ is self.__class__:
            result: Any = True
            for get in getters:
                result = get(self) == get(other)
                if not result:
                    return result
            return result
        return NotImplemented

    return __eq__


def _hash(key: Callable[[object], tuple[Any, ...]]) -> Callable[[object], int]:
    def __hash__(self: object) -> int:
        return hash(key(self))

    return __hash__
