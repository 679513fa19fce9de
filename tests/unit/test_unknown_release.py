"""A release newer than the tables: derived from its installed source, checks confirmed there.

A fake site-packages holds `sglang` (a link to the installed 0.5.23 source, or a bare
package) and a dist-info that says 0.5.24. The guard must derive the tables from that source,
let only the checks whose message the source holds act, and say how many in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_guard.preflight.preflight import Decision
from sglang_guard.preflight.shell.inputs import compat_for
from sglang_guard.preflight.shell.whichrelease import Release, resolve_release
from support.models import write_llama
from support.sglang import sglang_src


def _site(tmp: Path, version: str, source: Path | None, without: str = "") -> Path:
    """A site dir; with `source`, a tree of links to its .py files (less the one `without`)."""
    site = tmp / "site"
    site.mkdir()
    pkg = site / "sglang"
    if source is not None:
        for path in source.rglob("*.py"):
            rel = path.relative_to(source)
            if str(rel) == without:
                continue
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkg / rel).symlink_to(path)
    else:
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
    dist = site / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    (dist / "RECORD").write_text(f"sglang/__init__.py,,\n# {version}\n")
    return site


def test_without_source_every_check_only_warns(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_site(tmp_path, "0.5.24", None)))
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "cache"))
    release = resolve_release(version=None, version_source="", python=sys.executable)
    assert (release.version, release.tables.release) == ("0.5.24", "0.5.23")
    compat, notes = compat_for(release)
    (note,) = notes
    assert note.startswith("SGLang 0.5.24: not in the tables; 0 of ")
    assert not any(c.fatal for b in compat.backends for c in b.constraints)


def test_with_source_the_checks_it_holds_act(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    src = sglang_src() / "sglang"
    # A "0.5.24" whose arg_groups/overrides.py is gone: the checks cited there lose their
    # message in this source, the others keep theirs.
    site = _site(tmp_path, "0.5.24", src, without="srt/arg_groups/overrides.py")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "cache"))
    release = resolve_release(version=None, version_source="", python=sys.executable)
    assert release.version == "0.5.24"
    compat, notes = compat_for(release)
    (note,) = notes
    confirmed, total = (int(n) for n in
                        note.split("; ")[1].split(" backend checks")[0].split(" of "))
    assert 0 < confirmed < total
    cutedsl = compat.backend("cutedsl_mla")
    assert cutedsl is not None
    by_kind = {c.kind: c for c in cutedsl.constraints}
    assert not by_kind["gpu"].fatal  # overrides.py's SM100 check: not in this source, warns
    assert by_kind["arch"].fatal  # attention_registry.py's MLA check is still there, acts


def _decide(release: Release, tmp: Path, *extra: str) -> Decision:
    from sglang_guard.config.guardconfig import PolicyConfig  # noqa: PLC0415
    from sglang_guard.preflight.shell.inputs import decide, gather  # noqa: PLC0415

    model = write_llama(tmp / "llama")
    inputs = gather(["--model-path", str(model), *extra], "90", release)
    return decide(inputs, PolicyConfig(), str(tmp / "state"))


def test_without_source_the_size_checks_warn_and_say_so(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_site(tmp_path, "0.5.24", None)))
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "cache"))
    release = resolve_release(version=None, version_source="", python=sys.executable)
    d = _decide(release, tmp_path, "--tp-size", "3", "--nnodes", "2")
    (f,) = [f for f in d.findings if f.flag == "--tp-size"]
    assert f.action == "warn" and "not confirmed in the running release's own source" in f.reason
    (note,) = [w for w in d.warnings if "not in the tables" in w]  # one start line
    assert "0 of 13 size checks" in note and "tp_size (validation_hook.py:179)" in note


def test_with_source_a_size_check_it_still_has_acts(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    src = sglang_src() / "sglang"
    monkeypatch.setenv("SGLANG_GUARD_CACHE", str(tmp_path / "cache"))
    for gone, action in (("", "refuse"), ("srt/arg_groups/validation_hook.py", "warn")):
        tmp = tmp_path / (gone.replace("/", "_") or "whole")
        tmp.mkdir()
        monkeypatch.setenv("PYTHONPATH", str(_site(tmp, "0.5.24", src, without=gone)))
        release = resolve_release(version=None, version_source="", python=sys.executable)
        d = _decide(release, tmp, "--tp-size", "3", "--nnodes", "2")
        (f,) = [f for f in d.findings if f.flag == "--tp-size"]
        assert f.action == action, (gone, f.reason)
