"""The peers' throwaway venv: supervisor and circus from PyPI, pinned, built once per pin set.

It lives under `${SGLANG_GUARD_CACHE:-~/.cache/sglang-guard}/bench-peers-<hash>` (or a temp
dir with --fresh-peers), never in the guard's own environment.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from measure import HERE
from sups import Peers

REQUIREMENTS = HERE / "requirements-peers.txt"


def cache_dir() -> Path:
    """$SGLANG_GUARD_CACHE, else ~/.cache/sglang-guard."""
    return Path(os.environ.get("SGLANG_GUARD_CACHE") or Path.home() / ".cache" / "sglang-guard")


def ensure(where: Path | None = None) -> Peers:
    """Build (or reuse) the venv; its interpreter."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = where or cache_dir() / f"bench-peers-{digest}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists() and python.exists():
        return Peers(python)
    shutil.rmtree(venv, ignore_errors=True)
    print(f"installing supervisor and circus into {venv}", file=sys.stderr)
    wheels = os.environ.get("SGLANG_GUARD_BENCH_WHEELS")
    if wheels:  # offline (the H200 machine): bench/h200/prepare's wheels, the image's own pip
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index",
                        "--find-links", wheels, "-r", str(REQUIREMENTS)], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "-r", str(REQUIREMENTS)], check=True)
    (venv / ".complete").write_text(digest)
    return Peers(python)


def versions(peers: Peers) -> str:
    """"supervisor X, circus Y", as installed."""
    code = ("import importlib.metadata as m; "
            "print(f\"supervisor {m.version('supervisor')}, circus {m.version('circus')}\")")
    return subprocess.run([str(peers.python), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()
