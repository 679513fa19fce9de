"""`@record` makes what `@dataclass(frozen=True, slots=True)` makes (common/record.py).

Random class bodies are made twice from one source text, once with each decorator, and held
to each other: how the class is made (or the error making it raises), its signature, fields,
params, slots and match args, and, over random instances, construction errors, repr, eq,
hash, frozen assignment, `replace`, `asdict`, pickling and copying. Then every record of the
package is held to the stdlib class made from its own fields.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import pickle
import pkgutil
import random
import sys
from typing import Any

import pytest

import sglang_guard
from sglang_guard.common import record as record_module
from sglang_guard.common.record import record

TYPES = ("int", "str", "tuple[str, ...]", "int | None", "object")
VALUES: tuple[Any, ...] = (0, 1, -3, "a", "", "x y", (), ("a",), None, 2.5, math.nan,
                           frozenset({1}), True)
UNHASHABLE: tuple[Any, ...] = ([1], {"k": 1})
DEFAULTS = ("0", "'d'", "()", "None", "1.5")
FACTORIES = ("tuple", "list", "dict", "lambda: ('f',)")


def _field_line(rng: random.Random, index: int) -> tuple[str, bool]:
    """One annotated field of a random body, and whether it has a default."""
    name = "self" if index == 0 and rng.random() < 0.03 else f"f{index}"
    kind = rng.choice(("plain", "plain", "default", "factory", "field"))
    head = f"    {name}: {rng.choice(TYPES)}"
    if kind == "plain":
        return head, False
    if kind == "default":
        return f"{head} = {rng.choice(DEFAULTS)}", True
    if kind == "factory":
        return f"{head} = field(default_factory={rng.choice(FACTORIES)})", True
    args = []
    has = rng.random() < 0.7
    if has:
        args.append(rng.choice((f"default={rng.choice(DEFAULTS)}",
                                f"default_factory={rng.choice(FACTORIES)}")))
    for flag in ("repr", "compare", "kw_only"):
        if rng.random() < 0.3:
            args.append(f"{flag}={rng.choice(('True', 'False'))}")
    if rng.random() < 0.3:
        args.append(f"hash={rng.choice(('None', 'True', 'False'))}")
    if rng.random() < 0.1:
        args.append("metadata={'m': 1}")
    if rng.random() < 0.05:
        args.append("init=False")
    return f"{head} = field({', '.join(args)})", has


def body(rng: random.Random) -> tuple[str, str]:
    """A random class body (its decorator left as `{deco}`) and the decorator's keywords."""
    opts = []
    if rng.random() < 0.3:
        opts.append("kw_only=True")
    if rng.random() < 0.2:
        opts.append("eq=False")
    lines = ["{deco}", "class C:"]
    if rng.random() < 0.8:
        lines.append('    """A record."""')
    fields = [_field_line(rng, i)[0] for i in range(rng.randrange(0, 7))]
    if rng.random() < 0.7:
        fields.sort(key=lambda line: "=" in line and "kw_only=True" not in line)
    lines += fields
    extra = rng.random()
    if extra < 0.1:
        lines += ["    def __post_init__(self):", "        CALLS.append(self.__class__.__name__)"]
    elif extra < 0.15:
        lines += ["    def __post_init__(self):", "        raise ValueError('bad record')"]
    elif extra < 0.2:
        lines += ["    def __repr__(self):", "        return 'own repr'"]
    elif extra < 0.25:
        lines += ["    def __eq__(self, other):", "        return True"]
    elif extra < 0.3:
        lines += ["    def __hash__(self):", "        return 7"]
    elif extra < 0.33:
        lines += ["    x: ClassVar[int] = 3"]
    elif extra < 0.36:
        lines += ["    def __init__(self, *args):", "        object.__setattr__(self, 'f0', args)"]
    elif extra < 0.4:
        lines += ["    @property", "    def size(self) -> int:", "        return 1"]
    if len(lines) == 2:
        lines.append("    pass")
    return "\n".join(lines) + "\n", ", ".join(opts)


HEADER = """\
from __future__ import annotations
from dataclasses import dataclass, field
from typing import ClassVar
from sglang_guard.common.record import record
CALLS = []
"""


def make(text: str, deco: str, name: str) -> tuple[Any, Any]:
    """The class `text` makes with decorator `deco` (in a module of its own, as pickling needs
    it), or the error making it raised: (class or None, (type, message) or None)."""
    module = type(sys)(name)
    sys.modules[name] = module
    try:
        exec(HEADER + text.format(deco=deco), module.__dict__)  # noqa: S102 - the test's own text
    except Exception as exc:
        return None, (type(exc), str(exc))
    return module.__dict__["C"], None


def outcome(fn: Any) -> Any:
    """What `fn()` returns, or the type and message of what it raises."""
    try:
        return ("ok", fn())
    except Exception as exc:
        # (3.13 names the class with its module: one for each decorator here)
        return ("raised", type(exc), str(exc).replace("rec_theirs_", "rec_ours_"))


def field_view(f: dataclasses.Field[Any]) -> tuple[Any, ...]:
    factory = f.default_factory
    return (f.name, f.type, f.default, getattr(factory, "__name__", factory), f.init, f.repr,
            f.hash, f.compare, f.kw_only, dict(f.metadata))


def class_view(cls: Any) -> dict[str, Any]:
    params = cls.__dataclass_params__
    return {
        "signature": str(inspect.signature(cls)),
        "init_annotations": cls.__init__.__annotations__,
        "fields": [field_view(f) for f in dataclasses.fields(cls)],
        "params": {k: getattr(params, k) for k in params.__slots__},
        "slots": cls.__slots__,
        "match_args": cls.__match_args__,
        "doc": cls.__doc__,
        "hash_is_none": cls.__hash__ is None,
        "own": sorted(k for k in ("__repr__", "__eq__", "__hash__", "__getstate__",
                                  "__setstate__", "__setattr__", "__delattr__", "__init__")
                      if k in cls.__dict__),
        "qualnames": sorted(getattr(cls.__dict__.get(k), "__qualname__", None) or ""
                            for k in ("__repr__", "__eq__", "__hash__", "__init__")),
    }


def _kwargs(cls: Any, rng: random.Random, pool: tuple[Any, ...]) -> dict[str, Any]:
    return {f.name: rng.choice(pool) for f in dataclasses.fields(cls)
            if f.init and (rng.random() < 0.8 or (f.default is dataclasses.MISSING
                                                  and f.default_factory is dataclasses.MISSING))}


def instance_views(ours: Any, theirs: Any, rng: random.Random) -> None:
    """Held equal over random instances of the two classes, built from the same arguments."""
    made: list[tuple[Any, Any]] = []
    for _ in range(12):
        pool = VALUES + UNHASHABLE if rng.random() < 0.2 else VALUES
        kwargs = _kwargs(ours, rng, pool)
        if rng.random() < 0.2 and kwargs:
            kwargs.pop(rng.choice(list(kwargs)))
        if rng.random() < 0.1:
            kwargs["nope"] = 1
        a = outcome(lambda k=kwargs: ours(**k))
        b = outcome(lambda k=kwargs: theirs(**k))
        assert a[0] == b[0] and a[1:] != () and (a[0] == "ok" or a[1:] == b[1:]), (a, b)
        if a[0] == "ok":
            made.append((a[1], b[1]))
            if ours.__match_args__:  # positionally, the match args in order
                args = [kwargs.get(n, rng.choice(VALUES)) for n in ours.__match_args__]
                same(lambda a=args: ours(*a), lambda a=args: theirs(*a))
    names = [f.name for f in dataclasses.fields(ours)]
    for x, y in made:
        same(lambda x=x: repr(x), lambda y=y: repr(y))
        if ours.__hash__ is object.__hash__:  # eq=False: identity, as the stdlib's
            assert theirs.__hash__ is object.__hash__
        else:
            same(lambda x=x: hash(x), lambda y=y: hash(y))
        same(lambda x=x: dataclasses.asdict(x), lambda y=y: dataclasses.asdict(y))
        same(lambda x=x: dataclasses.astuple(x), lambda y=y: dataclasses.astuple(y))
        same(lambda x=x: x.__getstate__(), lambda y=y: y.__getstate__())
        for name in names:
            same(lambda x=x, n=name: setattr(x, n, 1), lambda y=y, n=name: setattr(y, n, 1))
            same(lambda x=x, n=name: delattr(x, n), lambda y=y, n=name: delattr(y, n))
        if ours.__setattr__.__module__ == record_module.__name__:  # made here: not a field
            with pytest.raises(dataclasses.FrozenInstanceError):  # 3.11's own raises TypeError
                x.not_a_field = 1
            assert repr(pickle.loads(pickle.dumps(x))) == repr(x)  # noqa: S301 - our own bytes
            assert repr(copy.copy(x)) == repr(x) and repr(copy.deepcopy(x)) == repr(x)
        changes = {n: rng.choice(VALUES) for n in names if rng.random() < 0.5}
        same(lambda x=x, c=changes: dataclasses.replace(x, **c),
             lambda y=y, c=changes: dataclasses.replace(y, **c))
    for (x, y), (u, v) in ((p, q) for p in made for q in made):
        same(lambda x=x, u=u: x == u, lambda y=y, v=v: y == v)
        same(lambda x=x, u=u: x != u, lambda y=y, v=v: y != v)


def same(ours: Any, theirs: Any) -> None:
    """`ours()` and `theirs()` return alike (by repr) or raise alike."""
    assert outcome(lambda: repr(ours())) == outcome(lambda: repr(theirs()))


@pytest.mark.parametrize("seed", range(400))
def test_a_record_is_the_stdlib_frozen_slotted_dataclass(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible body, not a secret
    text, opts = body(rng)
    ours, our_error = make(text, f"@record({opts})" if opts else "@record", f"rec_ours_{seed}")
    stdlib_deco = f"@dataclass(frozen=True, slots=True{', ' + opts if opts else ''})"
    theirs, their_error = make(text, stdlib_deco, f"rec_theirs_{seed}")
    assert our_error == their_error, text
    if ours is None:
        return
    mine, stdlib = class_view(ours), class_view(theirs)
    # qualnames and the methods' homes aside (the class's own module either way)
    assert {**mine, "qualnames": None} == {**stdlib, "qualnames": None}, text
    assert mine["qualnames"] == stdlib["qualnames"] or "__init__" in text
    calls = sys.modules[f"rec_ours_{seed}"].CALLS
    instance_views(ours, theirs, rng)
    assert calls == sys.modules[f"rec_theirs_{seed}"].CALLS  # __post_init__ ran as often


def test_the_fast_path_is_taken_for_plain_bodies() -> None:
    @record(kw_only=True)
    class Plain:
        """A plain record."""

        a: int
        b: tuple[str, ...] = ()

    assert Plain.__repr__.__module__ == record_module.__name__  # made here, not by the stdlib
    assert Plain.__init__.__code__.co_filename == "<string>"  # one compiled __init__
    assert repr(Plain(a=1)).endswith(".<locals>.Plain(a=1, b=())")


def _package_records() -> list[type]:
    for info in pkgutil.walk_packages(sglang_guard.__path__, "sglang_guard."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    found = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang_guard.") or module is None:
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and value.__module__ == name
                    and getattr(getattr(value, "__dataclass_params__", None), "frozen", False)):
                found.append(value)
    return found


def test_every_record_of_the_package_is_its_stdlib_dataclass() -> None:
    records = _package_records()
    assert len(records) > 150
    for cls in records:  # made by the stdlib only where record hands it over
        if cls.__setattr__.__module__ != record_module.__name__:
            annotations = inspect.get_annotations(cls).values()
            assert any(hasattr(base, "__dataclass_fields__") for base in cls.__mro__[1:]) or any(
                word in kind for kind in annotations for word in record_module._NOT_PLAIN), cls
    for cls in records:
        fields = dataclasses.fields(cls)
        twin = dataclasses.make_dataclass(
            cls.__name__,
            [(f.name, f.type, dataclasses.field(
                default=f.default, default_factory=f.default_factory, init=f.init, repr=f.repr,
                hash=f.hash, compare=f.compare, metadata=f.metadata, kw_only=f.kw_only))
             for f in fields],
            frozen=True, slots=True, eq=cls.__dataclass_params__.eq)  # type: ignore[attr-defined]
        assert str(inspect.signature(cls)) == str(inspect.signature(twin)), cls
        assert cls.__match_args__ == twin.__match_args__, cls  # type: ignore[attr-defined]
        assert [field_view(f) for f in fields] == [field_view(f) for f in dataclasses.fields(twin)]
        assert (cls.__hash__ is None) == (twin.__hash__ is None), cls
        for f in fields:
            with pytest.raises(dataclasses.FrozenInstanceError):
                object.__new__(cls).__setattr__(f.name, 1)
