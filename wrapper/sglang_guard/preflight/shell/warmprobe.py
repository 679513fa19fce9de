"""A cold `check` imports transformers in a forked child while it reads its own tables.

A `check` whose model facts are not cached spends ~0.45 s importing transformers (the fast
way, modelprobe.py) and ~0.05 s in AutoConfig, after ~0.1 s of its own imports and tables
(issue 24: cold <= 0.5 s). Where the facts of the line's `--model-path` are not in the cache,
`start` forks once, early: the child imports transformers while the parent parses the line,
reads the release and backend tables and decides; when the parent's `resolve_model` misses
the cache, it hands its request to the child (`ask`, set as modelprobe's `ask_warm`), which
resolves it exactly as the parent would have (modelprobe.resolve_model, writing the cache)
and answers with the facts' JSON, the form the cache and the isolated probe answer in.

What the child does not answer (it died, or resolving raised) the parent resolves itself, as
before, so errors keep their words. The guess costs only time when wrong: a child nobody
asks is killed and reaped at exit (`stop`, atexit); a parent killed outright leaves a child
that finishes its import and exits on the request pipe's end. Nothing forks with a second
thread running, off Linux (macOS, say: some of its frameworks break in a child forked without
exec), or where `SGLANG_GUARD_WARM_PROBE=0`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ENV_WARM = "SGLANG_GUARD_WARM_PROBE"  # "0": never fork (the parent imports transformers)
# SGLang's spellings of the model path (options-0.5.23.json: "--model-path", "--model")
_MODEL_FLAGS = ("--model-path", "--model")
_MODEL_EQ = tuple(f"{flag}=" for flag in _MODEL_FLAGS)


class _Probe:
    """The forked child and this process's ends of its two pipes."""

    def __init__(self, pid: int, requests: IO[str], answers: IO[str]) -> None:
        self.pid, self.requests, self.answers = pid, requests, answers


_probe: _Probe | None = None
_seen = {"forked": 0, "answered": 0, "pid": 0}  # what this process did (for tests: state())


def start(words: Sequence[str]) -> bool:
    """Fork the warm child when the facts of `words`' `--model-path` look uncached; whether
    it forked."""
    if (_probe is not None or os.environ.get(ENV_WARM, "1") == "0" or sys.platform != "linux"
            or ("threading" in sys.modules and _threads() > 1)):
        return False
    try:
        return _fork_if_cold(words)
    except Exception:
        return False


def _fork_if_cold(words: Sequence[str]) -> bool:
    global _probe  # noqa: PLW0603 - one child a process
    from sglang_guard.preflight.shell import modelprobe  # noqa: PLC0415 - the child needs it too

    path = _model_path(words)
    if path is None or modelprobe.looks_cached(path):
        return False
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (its answers are tested through the parent)
        os.close(requests_w)
        os.close(answers_r)
        _child(requests_r, answers_w)
    os.close(requests_r)
    os.close(answers_w)
    _seen["forked"] += 1
    _seen["pid"] = pid
    _probe = _Probe(pid, os.fdopen(requests_w, "w", encoding="utf-8"),
                    os.fdopen(answers_r, encoding="utf-8"))
    modelprobe.ask_warm = ask
    import atexit  # noqa: PLC0415

    atexit.register(stop)
    return True


def ask(request: dict[str, Any]) -> dict[str, Any] | None:
    """The child's facts JSON for `request` (resolve_model's arguments), or None: no child,
    or it answered with an error, or it is gone (the caller resolves in-process)."""
    if _probe is None:
        return None
    try:
        _probe.requests.write(json.dumps(request) + "\n")
        _probe.requests.flush()
        line = _probe.answers.readline()
    except OSError:
        return None
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    if not isinstance(answer, dict) or "error" in answer:
        return None
    _seen["answered"] += 1
    return answer


def stop() -> None:
    """End the child (killed if it is still importing) and reap it."""
    global _probe
    probe, _probe = _probe, None
    if probe is None:
        return
    from sglang_guard.preflight.shell import modelprobe  # noqa: PLC0415 - loaded by start

    modelprobe.ask_warm = None
    for end in (probe.requests, probe.answers):
        with contextlib.suppress(OSError):
            end.close()
    import signal  # noqa: PLC0415 - ~0.7 ms (its enums) a cached check does not need

    with contextlib.suppress(ProcessLookupError):
        os.kill(probe.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(probe.pid, 0)


def state() -> dict[str, int]:
    """How many children this process forked (the last one's pid), and how many requests
    they answered."""
    return dict(_seen)


def _threads() -> int:
    import threading  # noqa: PLC0415 - already loaded (the caller checked)

    return threading.active_count()


def _model_path(words: Sequence[str]) -> str | None:
    """The local model directory `words` name with a plain `--model-path` (or `--model`)."""
    found = None
    for i, word in enumerate(words):
        if word in _MODEL_FLAGS and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(_MODEL_EQ):
            found = word.split("=", 1)[1]
    if found is None or not (Path(found).expanduser() / "config.json").is_file():
        return None
    return found


def _child(requests_fd: int, answers_fd: int) -> None:  # pragma: no cover - in the child
    """Import transformers, then answer each request line with a facts line; never returns."""
    code = 0
    try:
        from sglang_guard.preflight.shell import modelprobe  # noqa: PLC0415

        modelprobe.warm_transformers()
        with (os.fdopen(requests_fd, encoding="utf-8") as requests,
              os.fdopen(answers_fd, "w", encoding="utf-8") as answers):
            for line in requests:
                answers.write(_answer(modelprobe, json.loads(line)) + "\n")
                answers.flush()
    except BaseException:  # the parent resolves what is not answered
        code = 1
    finally:
        os._exit(code)


def _answer(modelprobe: Any, request: dict[str, Any]) -> str:  # pragma: no cover - in the child
    try:
        return str(modelprobe.facts_json(modelprobe.resolve_model(**request)))
    except Exception as exc:  # the parent resolves it again, for its own words
        return json.dumps({"error": type(exc).__name__})
