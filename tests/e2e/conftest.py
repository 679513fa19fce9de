"""Fixtures of the e2e tier: the SGLang CPU venv's python, tiny models, SGLang's own answers.

The venv is built by `tests/e2e/setup-sglang-cpu` (once, ~90 s, cached outside the repo). A
missing venv skips this tier on a developer's machine but FAILS it in CI (`CI` set) or when
`SGLANG_GUARD_E2E=1`: a tier that silently skips is a tier that never runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

from .models import MODELS, write_all

HERE = Path(__file__).resolve().parent
SETUP = HERE / "setup-sglang-cpu"
ORACLE = HERE / "oracle.py"
MARKER = ".sglang-guard-complete"  # written last by setup-sglang-cpu
BUILD_HINT = "build it with: PY=$(tests/e2e/setup-sglang-cpu | tail -1)  (~90 s, ~6 GB)"


def _must_run() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("SGLANG_GUARD_E2E") == "1"


def _missing(reason: str) -> NoReturn:
    if _must_run():
        pytest.fail(f"e2e tier cannot run: {reason}; {BUILD_HINT}", pytrace=False)
    pytest.skip(f"{reason}; {BUILD_HINT} (or set SGLANG_GUARD_SGLANG_PYTHON)")


def _find_python() -> Path | None:
    """The venv python from the environment, else the cached venv if complete."""
    env = os.environ.get("SGLANG_GUARD_SGLANG_PYTHON")
    if env:
        return Path(env)
    out = subprocess.run([sys.executable, str(SETUP), "--print-path"], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()
    python = Path(out[-1])
    return python if (python.parent.parent / MARKER).is_file() else None


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """Path of the python of the SGLang 0.5.23 CPU venv."""
    python = _find_python()
    if python is None:
        _missing("the SGLang CPU venv is not built")
    elif not python.exists():
        _missing(f"SGLANG_GUARD_SGLANG_PYTHON={python} does not exist")
    return str(python)


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
def sglang_arch(sglang_python: str, tiny_model_dirs: dict[str, Path]) -> dict[str, Any]:
    """SGLang's own answer (oracle.py arch) for every tiny model: name -> row."""
    batch = [{"dir": str(tiny_model_dirs[m.name]), "is_draft": m.is_draft,
              "override_args": m.override_args} for m in MODELS]
    rows = run_oracle(sglang_python, "arch", batch)
    return {m.name: row for m, row in zip(MODELS, rows, strict=True)}
