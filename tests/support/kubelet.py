"""What a kubelet makes of a pod's volumes, on a local directory.

- an emptyDir: a directory created 0777 (pkg/volume/emptydir: `os.Chmod(dir, 0777)`);
- a ConfigMap or Secret volume: the AtomicWriter layout (pkg/volume/util/atomic_writer.go):
  the payload in a timestamped directory `..<timestamp>/`, a symlink `..data` to it, and one
  symlink per key `<key> -> ..data/<key>`; an update writes a new timestamped directory,
  makes `..data_tmp` point at it, renames `..data_tmp` over `..data` and removes the old one.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_STAMPS = itertools.count(1)


def empty_dir(path: Path) -> Path:
    """An emptyDir volume at `path`."""
    path.mkdir(parents=True)
    path.chmod(0o777)
    return path


def _payload(root: Path, files: Mapping[str, str], mode: int) -> str:
    name = f"..2026_12_01_00_00_{next(_STAMPS):02d}.{os.getpid()}"
    stamp = root / name
    stamp.mkdir(mode=0o755)
    for key, text in files.items():
        (stamp / key).write_text(text)
        (stamp / key).chmod(mode)
    return name


def config_map(root: Path, files: Mapping[str, str], mode: int = 0o644) -> Path:
    """A ConfigMap (or Secret: mode 0400/0644) volume at `root` holding `files`."""
    root.mkdir(parents=True)
    (root / "..data").symlink_to(_payload(root, files, mode))
    for key in files:
        (root / key).symlink_to(f"..data/{key}")
    return root


def update_config_map(root: Path, files: Mapping[str, str], mode: int = 0o644) -> None:
    """The kubelet's update: a new payload, `..data` swapped by a rename, the old one gone."""
    old = (root / "..data").readlink()
    tmp = root / "..data_tmp"
    tmp.symlink_to(_payload(root, files, mode))
    tmp.rename(root / "..data")
    for key in files:
        if not (root / key).is_symlink():
            (root / key).symlink_to(f"..data/{key}")
    shutil.rmtree(root / old)


# -- a container as the kubelet starts it, on this host ------------------------------------------

def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` references expanded as the kubelet expands them in command, args and env."""
    out = text
    for name, value in env.items():
        out = out.replace(f"$({name})", value)
    return out


def container_env(container: Mapping[str, Any], given: Mapping[str, str]) -> dict[str, str]:
    """The container's env: `value`s expanded in order, `fieldRef`s from `given`."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), {**given, **env})
        else:
            env[name] = given[name]  # a fieldRef (POD_IP): the test says what it is
    return env


def toml_dump(data: Mapping[str, Mapping[str, Any]]) -> str:
    """A guard config (tables of scalars and lists) as TOML text."""
    lines = []
    for table, values in data.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"
