"""Fixtures of the e2e tier: the SGLang CPU venvs' pythons, tiny models, SGLang's own answers.

Two real releases run (issue 11: conformance across releases): 0.5.23, the one the shipped
tables were first read from, and 0.5.18, an older one whose CLI and CPU start differ. Each venv
is built by `tests/e2e/setup-sglang-cpu --release R` (once, a few minutes, cached outside the
repo); `scripts/test` exports their pythons as SGLANG_GUARD_SGLANG_PYTHON and
SGLANG_GUARD_SGLANG_PYTHON_0_5_18. A missing venv skips this tier on a developer's machine but
FAILS it in CI (`CI` set) or when `SGLANG_GUARD_E2E=1`: a tier that silently skips is a tier
that never runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from .models import MODELS, write_all

HERE = Path(__file__).resolve().parent
SETUP = HERE / "setup-sglang-cpu"
ORACLE = HERE / "oracle.py"
MARKER = ".sglang-guard-complete"  # written last by setup-sglang-cpu
# The releases the e2e tier runs, and the variable that names each one's python.
RELEASES = ("0.5.23", "0.5.18")
PYTHON_ENV = {"0.5.23": "SGLANG_GUARD_SGLANG_PYTHON",
              "0.5.18": "SGLANG_GUARD_SGLANG_PYTHON_0_5_18"}


def _build_hint(release: str) -> str:
    return (f"build it with: PY=$(tests/e2e/setup-sglang-cpu --release {release} | tail -1)  "
            "(a few minutes, ~6 GB)")


def _must_run() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("SGLANG_GUARD_E2E") == "1"


def _missing(reason: str, release: str) -> NoReturn:
    if _must_run():
        pytest.fail(f"e2e tier cannot run: {reason}; {_build_hint(release)}", pytrace=False)
    pytest.skip(f"{reason}; {_build_hint(release)} (or set {PYTHON_ENV[release]})")


def _find_python(release: str) -> Path | None:
    """The venv python from the environment, else the cached venv if complete."""
    env = os.environ.get(PYTHON_ENV[release])
    if env:
        return Path(env)
    out = subprocess.run([sys.executable, str(SETUP), "--release", release, "--print-path"],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    python = Path(out[-1])
    return python if (python.parent.parent / MARKER).is_file() else None


def python_for(release: str) -> str:
    """Path of the python of the SGLang `release` CPU venv (skip or fail when missing)."""
    python = _find_python(release)
    if python is None:
        _missing(f"the SGLang {release} CPU venv is not built", release)
    elif not python.exists():
        _missing(f"{PYTHON_ENV[release]}={python} does not exist", release)
    return str(python)


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """Path of the python of the SGLang 0.5.23 CPU venv."""
    return python_for("0.5.23")


@pytest.fixture(scope="session")
def sglang_python_0_5_18() -> str:
    """Path of the python of the SGLang 0.5.18 CPU venv."""
    return python_for("0.5.18")


def run_oracle(python: str, mode: str, batch: list[Any], timeout: float = 300) -> list[Any]:
    """Run oracle.py in the SGLang venv on one batch; its JSON answer."""
    proc = subprocess.run([python, str(ORACLE), mode], input=json.dumps(batch),
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise AssertionError(f"oracle.py {mode} exited {proc.returncode}:\n{tail}")
    answer: list[Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every model of models.MODELS written once per session: name -> dir."""
    return write_all(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def sglang_arch(tiny_model_dirs: dict[str, Path]) -> Callable[[str], dict[str, Any]]:
    """A release's own answer (oracle.py arch) for every tiny model: release -> name -> row.

    One oracle process per release, on first use.
    """
    answers: dict[str, dict[str, Any]] = {}

    def of(release: str) -> dict[str, Any]:
        if release not in answers:
            batch = [{"dir": str(tiny_model_dirs[m.name]), "is_draft": m.is_draft,
                      "override_args": m.override_args} for m in MODELS]
            rows = run_oracle(python_for(release), "arch", batch)
            answers[release] = {m.name: row for m, row in zip(MODELS, rows, strict=True)}
        return answers[release]

    return of
