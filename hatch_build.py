"""The wheel's build hook: compiles the guard's two C modules.

- rules/_linescan.c: the traceback tracker's line search and the log path's C pieces;
- supervise/shell/_proctree.c: the stop's walk of the child's tree before its SIGTERM.

Each is an accelerator, not a requirement: where no C compiler or Python headers are found
(or a module does not build on this platform) the build goes on without it (one warning on
stderr) and the guard does the same in Python, with the same answers (rules/linescan.py,
supervise/shell/proctree.py). Each is built against the limited API of Python 3.11 (abi3), so
one wheel serves every later Python on the platform.

A module is written beside its source, where an editable install (`pip install -e .`,
scripts/test) imports it, and put into a regular wheel under the same name.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# (source, what it is for a warning): each is built beside its source as <name>.abi3.so.
MODULES = (
    (Path("wrapper/sglang_guard/rules/_linescan.c"), "the C line search; the regexes serve"),
    (Path("wrapper/sglang_guard/supervise/shell/_proctree.c"),
     "the C tree walk; the Python walk serves"),
)
STAMP = Path("wrapper/sglang_guard/_build.txt")  # git-ignored: written for each wheel
STAMP_IN_WHEEL = "sglang_guard/_build.txt"


def target_of(source: Path) -> Path:
    """Where the module built from `source` is written (and its path in the wheel, below
    wrapper/)."""
    return source.with_name(source.stem + ".abi3.so")


def compile_module(root: Path, source: Path, what: str) -> Path | None:
    """Build one module beside its source; its path, or None (with a warning) if it cannot
    be built here."""
    target = root / target_of(source)
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    command = [*cc, "-shared", "-fPIC", "-O2", "-Wall", "-I", include, str(root / source),
               "-o", str(target)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"sglang-guard: {source.name} is not built ({exc}): {what}", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"sglang-guard: {source.name} is not built: {what}:\n" + done.stderr[-2000:],
              file=sys.stderr)
        target.unlink(missing_ok=True)
        return None
    return target


def write_stamp(root: Path) -> Path:
    """Write which commit a wheel is built from beside the package's source (`<short sha>`,
    `+dirty` when tracked files differ from it; `unknown` without git): the bench names the
    guard a wheel runs by it (bench/compare/main.guard_build), where no .git came along."""
    program = shutil.which("git")

    def git(*args: str) -> str | None:
        if program is None:
            return None
        try:
            done = subprocess.run([program, "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    stamp = "unknown" if commit is None else commit + ("+dirty" if dirty else "")
    target = root / STAMP
    target.write_text(stamp + "\n", encoding="utf-8")
    return target


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc]
    """hatchling calls `initialize` before it builds a wheel or an editable wheel."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        built = [(source, compile_module(root, source, what)) for source, what in MODULES]
        if version == "editable":
            return  # editable: each module sits beside its source, on the package's path
        build_data["force_include"][str(write_stamp(root))] = STAMP_IN_WHEEL
        for source, target in built:
            if target is not None:
                in_wheel = target_of(source).relative_to("wrapper").as_posix()
                build_data["force_include"][str(target)] = in_wheel
        if all(target is None for _, target in built):
            return
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"cp311-abi3-{platform}"
