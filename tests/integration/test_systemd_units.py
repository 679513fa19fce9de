"""The shipped unit files load on this systemd (252 on Debian 12): `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_ENVIRONMENT

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"


def _verify(
    unit: Path, tmp_path: Path, instance: str | None = None
) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("sglang-guard") or str(Path(sys.executable).parent / "sglang-guard")
    text = unit.read_text().replace("/usr/local/bin/sglang-guard", exe)
    target = tmp_path / unit.name
    target.write_text(text)
    if instance is not None:  # a template is verified through one of its instances
        link = tmp_path / unit.name.replace("@.", f"@{instance}.")
        link.symlink_to(target)
        target = link
    return subprocess.run(["systemd-analyze", "verify", str(target)],
                          capture_output=True, text=True, check=False)


@pytest.fixture(autouse=True)
def _needs_systemd_analyze() -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: .ci/run installs systemd for this test")


def test_service_verifies(tmp_path: Path) -> None:
    out = _verify(UNITS / "sglang-guard.service", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr  # systemd-analyze only warns on bad values


def test_template_verifies(tmp_path: Path) -> None:
    out = _verify(UNITS / "sglang-guard@.service", tmp_path, instance="llama")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr


@pytest.mark.parametrize("unit", ["sglang-guard.service", "sglang-guard@.service"])
def test_units_say_what_the_product_promises(unit: str) -> None:
    text = (UNITS / unit).read_text()
    for directive in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "KillMode=mixed",
                      "RestartPreventExitStatus=78 2", "WatchdogSec=", "NotifyAccess=main"):
        assert directive in text, f"{unit} lacks {directive}"
    assert "PrivateDevices=yes" not in text  # would hide /dev/nvidia*
    assert "Type=notify-reload" not in text.split("# Optional")[0]  # needs systemd 253


def test_a_unit_with_a_typo_fails_verification(tmp_path: Path) -> None:
    bad = tmp_path / "bad.service"
    bad.write_text((UNITS / "sglang-guard.service").read_text()
                   .replace("/usr/local/bin/sglang-guard", "/bin/true")
                   .replace("KillMode=mixed", "KillMode=mixd"))
    out = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True,
                         check=False)
    assert "kill mode" in out.stderr  # verify warns (rc 0) on a bad value: why we check stderr


@pytest.mark.parametrize("unit", ["sglang-guard.service", "sglang-guard@.service"])
def test_units_do_not_restart_a_broken_environment(unit: str) -> None:
    """Exit 69 (environment failure): no restart can fix it, so systemd must not retry."""
    line = next(ln for ln in (UNITS / unit).read_text().splitlines()
                if ln.startswith("RestartPreventExitStatus="))
    assert str(EXIT_ENVIRONMENT) in line.split("=", 1)[1].split()


def _exposure(unit: Path, tmp_path: Path, instance: str | None = None) -> float:
    """`systemd-analyze security --offline=true`'s overall exposure level of the unit."""
    import re  # noqa: PLC0415

    target = tmp_path / unit.name
    target.write_text(unit.read_text())
    if instance is not None:
        link = tmp_path / unit.name.replace("@.", f"@{instance}.")
        link.symlink_to(target)
        target = link
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(target)],
                         capture_output=True, text=True, check=False)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    assert m is not None, out.stdout + out.stderr
    return float(m.group(1))


@pytest.mark.parametrize(("unit", "instance"), [("sglang-guard.service", None),
                                                ("sglang-guard@.service", "llama")])
def test_units_are_hardened_under_4(unit: str, instance: str | None, tmp_path: Path) -> None:
    level = _exposure(UNITS / unit, tmp_path, instance)
    print(f"\nsystemd-analyze security {unit}: {level}")
    assert level < 4.0
    text = (UNITS / unit).read_text()
    assert "User=sglang-guard" in text  # its own user, which the sysusers file creates
    sysusers = (UNITS / "sglang-guard.sysusers").read_text()
    assert "u sglang-guard " in sysusers
