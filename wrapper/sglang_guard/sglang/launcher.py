"""A whole pasted command line read for its SGLang arguments: `check -- python -m
sglang.launch_server --model-path M …` means what `check -- --model-path M …` means.

Pure: tokens in, tokens out. Recognised (each after any leading `NAME=value` environment
words, as a shell line or a unit file's ExecStart= may start):
- `<python> -m sglang.launch_server ARGS…` (any python, python3, python3.11, or a path to one),
  and the guard's drop-in for it: `<python> -m sglang_guard.launch_server ARGS…`,
  `sglang-guard-launch ARGS…` -> the launch_server arguments;
- `sglang serve ARGS…` (the `sglang` script, or a path to it) and `sglang-guard serve ARGS…`
  -> `sglang serve`'s arguments, which serve.split_args then reads as SGLang does.
Anything else is taken as the arguments themselves, as before.

`split_args`, `selected_backend`, `model_path_of` and `serve_error` read `sglang serve`'s own
arguments as the release's serve.py reads them before it picks a backend (`ServeReading`:
what changed from release to release; tests/unit/test_serve_reading.py runs each shipped
release's own functions on the same words).

`runner` is the launcher's first word where it is a path (`/opt/venv/bin/python3`,
`/venv/bin/sglang`): the environment the line runs, whose SGLang release `check` then
decides for when it is told of no other (checkcmd.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sglang_guard.common.record import record

# (No regex: this module is on a cached `check`'s path, where compiling one costs ~0.5 ms.)
# string.ascii_letters and digits, spelled out: the `string` module compiles its Template
# pattern at import (~0.75 ms of a `check`).
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_REST = _NAME_START | frozenset("0123456789")
_MODULES = ("sglang.launch_server", "sglang_guard.launch_server")
_SELECTOR = "--model-type"  # sglang/cli/serve.py:30-61 `_extract_model_type_override`


@record
class Launch:
    """What a command line runs: `form` "launch_server" or "serve" (a launcher was named),
    or "args" (none was: the words are SGLang's arguments); `args` the words after it."""

    form: Literal["launch_server", "serve", "args"]
    args: tuple[str, ...]
    runner: str | None = None  # the launcher's first word, where it is a path
    launcher: tuple[str, ...] = ()  # the words before `args`: environment words, launcher

    def split(self, reading: ServeReading | None = None
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(`sglang serve`'s own options, the launch_server arguments): `split_args` for a
        serve line (as `reading`'s release reads it; None: the newest), none of its own
        otherwise."""
        return split_args(self.args, reading) if self.form == "serve" else ((), self.args)

    def head(self, reading: ServeReading | None = None) -> tuple[str, ...]:
        """What a command line with other launch_server arguments starts with, as this one
        was given: its environment words and launcher, and `sglang serve`'s own options;
        `python -m sglang.launch_server` for bare arguments."""
        if self.form == "args":
            return ("python", "-m", "sglang.launch_server")
        return (*self.launcher, *self.split(reading)[0])


def _name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _is_python(name: str) -> bool:
    """python, python3, python3.11 (`python(\\d+(\\.\\d+)*)?`)."""
    if not name.startswith("python"):
        return False
    version = name[len("python"):]
    return not version or all(part.isdigit() and part.isascii() for part in version.split("."))


def _is_env_word(word: str) -> bool:
    """NAME=value, as a shell reads an assignment before a command."""
    name, eq, _ = word.partition("=")
    return bool(eq) and bool(name) and name[0] in _NAME_START and set(name) <= _NAME_REST


# The interpreter's own options a command line may give before `-m` (python(1)): flags that
# take no value, and the two that take one (`-X opt`, `-W arg`, or attached: `-Xdev`).
_PY_FLAGS = frozenset("bBdEiIOqsSuvR")
_PY_VALUED = ("-X", "-W")


def _module_args(words: Sequence[str]) -> tuple[str, ...] | None:
    """After `python [options] -m MODULE` (`words[0]` the interpreter): the module's
    arguments when MODULE is launch_server's (or the guard's drop-in), else None."""
    i = 1
    while i < len(words) and words[i].startswith("-") and not words[i].startswith("-m"):
        word = words[i]
        if word in _PY_VALUED:
            i += 2
        elif word[:2] in _PY_VALUED or (len(word) > 1 and set(word[1:]) <= _PY_FLAGS):
            i += 1
        else:
            return None  # an option python(1) takes otherwise (-c, --help): not a launch
    if i >= len(words):
        return None
    if words[i] == "-m" and i + 1 < len(words) and words[i + 1] in _MODULES:
        return tuple(words[i + 2:])
    if words[i][2:] in _MODULES and words[i].startswith("-m"):  # -msglang.launch_server
        return tuple(words[i + 1:])
    return None


def is_serve_launch(launch: Sequence[str]) -> bool:
    """Whether a configured launch command (`[sglang] launch`) is `sglang serve`."""
    return len(launch) >= 2 and launch[-1] == "serve" and _name(launch[-2]) == "sglang"


def read_launch(words: Sequence[str]) -> Launch:
    """The launcher `words` start with, if any, and the arguments after it."""
    start = 0
    while start < len(words) and _is_env_word(words[start]):
        start += 1
    head = [*words[start:start + 3]]
    rest = tuple(words[start:])
    runner = head[0] if head and "/" in head[0] else None

    def launch(form: Literal["launch_server", "serve"], args: tuple[str, ...],
               runner: str | None) -> Launch:
        return Launch(form, args, runner, tuple(words[:len(words) - len(args)]))

    if head and _is_python(_name(head[0])):
        after = _module_args(rest)
        if after is not None:
            return launch("launch_server", after, runner)
    if head and _name(head[0]) == "sglang-guard-launch":
        return launch("launch_server", rest[1:], None)
    if len(head) >= 2 and _name(head[0]) in ("sglang", "sglang-guard") and head[1] == "serve":
        return launch("serve", rest[2:], runner if _name(head[0]) == "sglang" else None)
    return Launch("args", tuple(words))


@record
class ServeReading:
    """How one release's `sglang serve` reads its words before launch_server's parser gets
    them, each read from that release's wheel (sglang/cli/serve.py, sglang/cli/utils.py,
    the dist-info's entry_points.txt) and held to it by tests/unit/test_serve_reading.py."""

    release: str | None  # None: the newest shipped behaviour
    exists: bool = True  # the `sglang` console script ships (0.5.5 on; none in 0.5.4.post3)
    selector: bool = True  # serve.py takes `--model-type` out (0.5.10 on); before, the
    #   word goes on to launch_server's parser, which has no such flag
    positional: bool = True  # a first bare word is the model path (0.5.16 on:
    #   serve.py `_normalize_positional_model_path`); before, it goes on to the parser
    model_alias: bool = True  # cli/utils.py `get_model_path` takes `--model` too (0.5.11 on)
    fixed_types: bool = False  # `--model-type` must be auto, llm or diffusion (0.5.10 to
    #   0.5.17); from 0.5.18 a registry of backends, installed ones included, answers


NEWEST_SERVE = ServeReading(None)


def _release_key(version: str) -> tuple[int, ...]:
    """The leading numbers of a release ("0.5.15.post1" -> (0, 5, 15)): every change above
    came with a numbered release, never with a post release."""
    key: list[int] = []
    for part in version.split("."):
        if not (part.isdigit() and part.isascii()):
            break
        key.append(int(part))
    return tuple(key)


def serve_reading(version: str | None) -> ServeReading:
    """How `version`'s `sglang serve` reads its words (None or not a version: the newest)."""
    key = _release_key(version) if version else ()
    if not key:
        return NEWEST_SERVE
    return ServeReading(version, exists=key >= (0, 5, 5), selector=key >= (0, 5, 10),
                        positional=key >= (0, 5, 16), model_alias=key >= (0, 5, 11),
                        fixed_types=(0, 5, 10) <= key < (0, 5, 18))


def split_args(args: Sequence[str], reading: ServeReading | None = None
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(`sglang serve`'s own options, the server arguments), read as `reading`'s serve.py
    reads them (None: the newest): the selector out, then a positional model path."""
    reading = reading or NEWEST_SERVE
    own: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if reading.selector and arg == _SELECTOR and i + 1 < len(args):
            own += [arg, args[i + 1]]
            i += 2
            continue
        if reading.selector and arg.startswith(f"{_SELECTOR}="):
            own.append(arg)
        else:
            rest.append(arg)
        i += 1
    if reading.positional and rest and not rest[0].startswith("-"):  # `sglang serve MODEL …`
        rest = ["--model-path", rest[0], *rest[1:]]
    return tuple(own), tuple(rest)


def serve_error(args: Sequence[str], reading: ServeReading | None = None) -> str | None:
    """What `reading`'s `sglang serve` raises for `args` before launch_server's parser reads
    them, with SGLang's own words (None: it hands them to the parser, or to another
    backend). The LLM backend's checks only: another backend is not the guard's to judge."""
    reading = reading or NEWEST_SERVE
    release = f"SGLang {reading.release}" if reading.release else "SGLang"
    if not reading.exists:
        return (f"{release} has no `sglang serve`: the `sglang` command first ships with "
                "0.5.5 (its wheel's entry_points.txt); run `python -m sglang.launch_server` "
                "with the same arguments")
    i = 0
    while reading.selector and i < len(args):  # serve.py `_extract_model_type_override`
        if args[i] == _SELECTOR:
            if i + 1 >= len(args):
                return (f"{release}'s `sglang serve` fails: Error: --model-type requires a "
                        "value. (sglang/cli/serve.py `_extract_model_type_override`)")
            i += 1
        i += 1
    own, server_args = split_args(args, reading)
    chosen = selected_backend(own)
    if reading.selector and not chosen and not reading.fixed_types:
        return (f"{release}'s `sglang serve` fails: Error: --model-type requires a non-empty "
                "value. (sglang/cli/serve.py `_extract_model_type_override`)")
    if reading.fixed_types and chosen not in ("auto", "llm", "diffusion"):
        return (f"{release}'s `sglang serve` fails: Error: invalid --model-type {chosen!r}. "
                "Valid values are: auto, llm, diffusion. (sglang/cli/serve.py "
                "`_extract_model_type_override`)")
    if chosen not in ("auto", "llm"):
        return None  # another backend's: not the LLM server's checks
    if model_path_of(server_args, reading) is None:
        spellings = "--model-path or --model" if reading.model_alias else "--model-path"
        bare = ("" if reading.positional
                else "; a bare model path first is read only from 0.5.16 on")
        return (f"{release}'s `sglang serve` fails before it parses: Error: --model-path is "
                f"required. Please provide the path to the model. (sglang/cli/utils.py "
                f"`get_model_path`: it reads {spellings}{bare})")
    return None


def selected_backend(own: Sequence[str]) -> str:
    """The backend `--model-type` selects ("auto" when none: serve.py:30-61 reads it so)."""
    chosen = "auto"
    for i, arg in enumerate(own):
        if arg == _SELECTOR and i + 1 < len(own):
            chosen = own[i + 1]
        elif arg.startswith(f"{_SELECTOR}="):
            chosen = arg.split("=", 1)[1]
    return chosen


def model_path_of(server_args: Sequence[str], reading: ServeReading | None = None
                  ) -> str | None:
    """The model path as serve.py finds it before parsing (sglang/cli/utils.py
    `get_model_path`, 0.5.18 on `try_get_model_path`: the first `--model-path`, or from
    0.5.11 `--model`, spaced or with `=`)."""
    names = ("--model-path", "--model") if (reading or NEWEST_SERVE).model_alias else (
        "--model-path",)
    for i, arg in enumerate(server_args):
        if arg in names:
            return server_args[i + 1] if i + 1 < len(server_args) else None
        if arg.startswith(tuple(f"{name}=" for name in names)):
            return arg.split("=", 1)[1]
    return None
