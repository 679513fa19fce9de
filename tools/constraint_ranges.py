#!/usr/bin/env python3
"""Which SGLang releases each constraint of configs/backends.toml holds for (read from the wheels).

    tools/constraint_ranges.py            # print the range of every constraint
    tools/constraint_ranges.py --write    # write the ranges into configs/backends.toml and
                                          # configs/sglang/constraint-lines.json

A range is where the release's code *behaves* so, not where a message appears: an older
release often fails the same line later and less clearly. A constraint with `evidence`
(the code that makes the combination fail: `{ files = [...], has = "...", lacks = "..." }`,
every item must hold, `files` are alternatives, first found wins) gets `sglang` = the newest
contiguous run, among the releases whose parser accepts the backend, whose source holds all
its evidence; its `said` is where its message is printed (SGLang's own text: the releases
whose source holds it; `message_by = "python"` or "kernel": a text Python or a kernel library
prints whenever the behaviour holds, so no `said`). constraint-lines.json gets, per such
constraint, the file:line of its first evidence item in every release, as runs.

A constraint without evidence keeps the message test: the newest contiguous run of releases
whose source holds every literal part of its message (SGLang rewords its checks between
releases); one without a message either gets the release the table was read from. Outside its
range a constraint warns (preflight/compat_table.py), never drops silently. Wheels come from
`tools/fetch-sglang-wheels` (cached outside the repo); nothing is imported, the .py files are
read as text.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

from packaging.version import Version

from sglang_guard.sglang.msgsearch import NOT_SERVER, holds, normalise, parts

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "configs" / "backends.toml"
LINES = REPO / "configs" / "sglang" / "constraint-lines.json"
MODEL_LISTS = REPO / "configs" / "sglang" / "model-backends.json"
KV4 = REPO / "configs" / "sglang" / "kv4.json"
KV_SM = REPO / "configs" / "sglang" / "kv-sm.json"
_KV4_DEF = re.compile(r"def _?handle_kv4_compatibility\(")
_KV4_DTYPES = re.compile(r"kv_cache_dtype (?:not in (\([^)]*\))|!= (\"[^\"]+\"))")
RELEASES = REPO / "configs" / "sglang" / "releases.txt"
BACKEND_LISTS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def wheel_dir() -> Path:
    """Where tools/fetch-sglang-wheels keeps the wheels."""
    import os

    cache = os.environ.get("SGLANG_GUARD_CACHE") or str(Path.home() / ".cache" / "sglang-guard")
    return Path(cache) / "wheels"


def releases() -> list[str]:
    """Shipped releases, oldest first."""
    lines = RELEASES.read_text(encoding="utf-8").splitlines()
    return [v.strip() for v in lines if v.strip() and not v.startswith("#")]


def source_text(wheel: Path) -> str:
    """Every .py file of the sglang package in `wheel`, joined."""
    return normalise("\n".join(source_files(wheel).values()))


def source_files(wheel: Path) -> dict[str, str]:
    """Every server .py file of the sglang package in `wheel`, by path."""
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n).decode("utf-8", "replace") for n in zf.namelist()
                if n.startswith("sglang/") and n.endswith(".py")
                and not n.startswith(NOT_SERVER)}


class Release(NamedTuple):
    """One release's source, for the evidence and message tests."""

    version: str
    text: str  # every file joined and normalised (msgsearch)
    files: dict[str, str]
    backends: frozenset[str]  # the names its parser accepts
    kv_dtypes: frozenset[str] = frozenset()  # the --kv-cache-dtype choices of its parser
    place: int = 0  # its place among the shipped releases, oldest first


def evidence_at(files: dict[str, str], evidence: list[dict[str, Any]]) -> str | None:
    """"path:line" of the first item's `has` when every item holds in `files`, else None."""
    first: str | None = None
    for item in evidence:
        path = next((f for f in item["files"] if f in files), None)
        if path is None:
            return None
        text = files[path]
        if "lacks" in item and item["lacks"] in text:
            return None
        if "has" in item:
            at = text.find(item["has"])
            if at < 0:
                return None
            cite = f"{path}:{text.count(chr(10), 0, at) + 1}"
        else:
            cite = f"{path}:1"
        first = first or cite
    return first


def behaviour_spec(present: list[bool | None], versions: list[str]) -> str:
    """The newest contiguous run of True among the releases not None (None: the release has
    no such backend, so it neither extends nor breaks a run)."""
    idx = [i for i, p in enumerate(present) if p is not None]
    trues = [i for i in idx if present[i]]
    if not trues:
        raise SystemExit("evidence found in no release that has the backend")
    last = trues[-1]
    pos = idx.index(last)
    first_pos = pos
    while first_pos > 0 and present[idx[first_pos - 1]]:
        first_pos -= 1
    spec = f">={versions[idx[first_pos]]}"
    if pos < len(idx) - 1:
        spec += f",<{versions[idx[pos + 1]]}"
    return spec


def runs(cites: list[tuple[str, str | None]]) -> list[list[str]]:
    """[[first, last, cite], ...] over consecutive releases with the same cite."""
    out: list[list[str]] = []
    for version, cite in cites:
        if cite is None:
            continue
        if out and out[-1][2] == cite:
            out[-1][1] = version
        else:
            out.append([version, version, cite])
    return out


def spec_for(present: list[bool], versions: list[str], fallback: str) -> str:
    """A PEP 440 specifier for the newest contiguous run of releases marked present."""
    if not any(present):
        return f"=={fallback}"
    last = max(i for i, p in enumerate(present) if p)
    first = last
    while first > 0 and present[first - 1]:
        first -= 1
    lo = f">={versions[first]}"
    if last == len(versions) - 1:
        return lo
    return f"{lo},<{versions[last + 1]}"


def constraints(doc: dict[str, object]) -> list[tuple[str, int, str | None]]:
    """(backend, index, message) for every constraint, in file order."""
    out: list[tuple[str, int, str | None]] = []
    for name, backend in doc["backends"].items():  # type: ignore[attr-defined]
        for i, c in enumerate(backend.get("constraints", [])):
            out.append((name, i, c.get("message")))
    return out


def derive(doc: dict[str, Any], rels: list[Release]
           ) -> tuple[dict[tuple[str, int], dict[str, str]], dict[str, list[list[str]]]]:
    """Per constraint its `sglang` (and `said`) specs, and the evidence lines by key."""
    versions = [r.version for r in rels]
    read_from = str(doc["meta"]["sglang_version"])
    specs: dict[tuple[str, int], dict[str, str]] = {}
    lines: dict[str, list[list[str]]] = {}
    for name, backend in doc["backends"].items():
        real = name.split("@", 1)[0]
        for i, c in enumerate(backend.get("constraints", [])):
            message = c.get("message")
            said = None
            if message is not None and parts(message):
                said = spec_for([holds(r.text, message) for r in rels], versions, read_from)
            if "evidence" in c:
                cites = [(r.version, evidence_at(r.files, c["evidence"])
                          if real in r.backends else None) for r in rels]
                present = [None if real not in r.backends else cite is not None
                           for r, (_, cite) in zip(rels, cites, strict=True)]
                out = {"sglang": behaviour_spec(present, versions)}
                if said is not None and c.get("message_by") is None:
                    out["said"] = said
                lines[f"{name}[{i}]"] = runs(cites)
            else:
                out = {"sglang": said or f"=={read_from}"}
            specs[(name, i)] = out
    return specs, lines


def write(text: str, specs: dict[tuple[str, int], dict[str, str]]) -> str:
    """`text` with `sglang = "..."` (and `said = "..."`) lines under each constraint header
    (replacing any)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    counts: dict[str, int] = {}
    header = re.compile(r"^\[\[backends\.([A-Za-z0-9_.@\"-]+?)\.constraints\]\]\s*$")
    skip_old = False
    for line in lines:
        if skip_old and line.startswith(("sglang = ", "said = ")):
            continue
        skip_old = False
        out.append(line)
        m = header.match(line)
        if m:
            name = m.group(1).strip('"')
            i = counts.get(name, 0)
            counts[name] = i + 1
            for key in ("sglang", "said"):
                if key in specs[(name, i)]:
                    out.append(f'{key} = "{specs[(name, i)][key]}"\n')
            skip_old = True
    return "".join(out)


def model_list_at(files: dict[str, str], spec: dict[str, str]
                  ) -> tuple[list[str], str, list[str]] | None:
    """The allow-list literal of one model in one release, its file:line and the flags it
    is checked on (older releases assert on --attention-backend alone); None if none."""
    for path, raw in files.items():
        at = raw.find(spec["anchor"])
        if at < 0 or not holds(normalise(raw), spec["message"]):
            continue
        start = raw.find(spec["list_start"], at)
        said = raw.find(spec["message"].split("{", 1)[0], at)
        if start < 0 or said < start:
            continue
        start += len(spec["list_start"]) - 1
        end = raw.index("]", start)
        value = ast.literal_eval(raw[start:end + 1])
        slots = (["attention", "prefill", "decode"] if "prefill" in raw[end:said]
                 else ["attention"])
        return [str(v) for v in value], f"{path}:{raw.count(chr(10), 0, start) + 1}", slots
    return None


def model_lists(doc: dict[str, Any], rels: list[Release]) -> dict[str, list[list[Any]]]:
    """Per architecture, runs [first, last, [backends], "file:line"] of the same list."""
    out: dict[str, list[list[Any]]] = {}
    for spec in doc.get("model_backends", []):
        runs_: list[list[Any]] = []
        for r in rels:
            found = model_list_at(r.files, spec)
            if found is None:
                continue
            allowed, cite, slots = found
            if runs_ and runs_[-1][2:] == [allowed, cite, slots]:
                runs_[-1][1] = r.version
            else:
                runs_.append([r.version, r.version, allowed, cite, slots])
        out[spec["architecture"]] = runs_
    return out


def _line(raw: str, at: int) -> int:
    return raw.count("\n", 0, at) + 1


def kv4_at(files: dict[str, str], spec: dict[str, Any]) -> dict[str, Any] | None:
    """One release's FP4 KV cache checks (its handle_kv4_compatibility), or None."""
    for path, raw in files.items():
        m = _KV4_DEF.search(raw)
        if m is None:
            continue
        end = raw.find("\n    def ", m.end())
        end2 = raw.find("\ndef ", m.end())
        stop = min(x for x in (end, end2, len(raw)) if x > 0)
        body = raw[m.start():stop]
        d = _KV4_DTYPES.search(body)
        if d is None:
            return None
        dtypes = [str(x) for x in ast.literal_eval(d.group(1))] if d.group(1) else [
            ast.literal_eval(d.group(2))]
        out: dict[str, Any] = {"dtypes": dtypes, "lists": {}}
        sm = body.find(spec["sm_message"])
        if sm >= 0:
            out["sm"] = f"{path}:{_line(raw, m.start() + sm)}"
        prefill = nvfp4_prefill_at(files, spec)
        if prefill is not None:
            out["nvfp4_prefill"] = prefill
        for arch, start in (("mla", spec["mla_list"]), ("mha", spec["mha_list"])):
            at = body.find(start)
            if at < 0:
                continue
            lo = at + len(start) - 1
            hi = body.index("]", lo)
            out["lists"][arch] = [[str(v) for v in ast.literal_eval(body[lo:hi + 1])],
                                  f"{path}:{_line(raw, m.start() + lo)}"]
        return out
    return None


def nvfp4_prefill_at(files: dict[str, str], spec: dict[str, Any]) -> dict[str, Any] | None:
    """The release's NVFP4 prefill resolution (handle_nvfp4_prefill_kv_dequant_dtype): the
    prefill backend of each dequant dtype and the lines of its three refusals; None if none."""
    start = spec["prefill_map"]
    for path, raw in files.items():
        at = raw.find(start)
        if at < 0:
            continue
        lo = at + len(start) - 1
        mapping = ast.literal_eval(raw[lo:raw.index("}", lo) + 1])
        out: dict[str, Any] = {"backends": {str(k): str(v) for k, v in mapping.items()}}
        for key in ("neither", "sm100", "decode"):
            message = spec[f"prefill_{key}"]
            if message not in normalise(raw):
                return None
            out[key] = f"{path}:{_line(raw, raw.find(message[:24]))}"
        return out
    return None


def kv4_runs(doc: dict[str, Any], rels: list[Release]) -> list[list[Any]]:
    """[[first, last, checks], ...] over releases with the same KV4 checks."""
    spec = doc.get("kv4")
    if spec is None:
        return []
    out: list[list[Any]] = []
    for r in rels:
        found = kv4_at(r.files, spec)
        if found is None:
            continue
        if out and out[-1][2] == found:
            out[-1][1] = r.version
        else:
            out.append([r.version, r.version, found])
    return out


def kv_sm_at(files: dict[str, str], message: str) -> str | None:
    """"path:line" of the SM refusal `message` of a KV dtype in one release, or None."""
    for path, raw in files.items():
        if holds(normalise(raw), message):
            return f"{path}:{_line(raw, raw.index(message[:24]))}"
    return None


def kv_sm_runs(doc: dict[str, Any], rels: list[Release]) -> dict[str, list[list[Any]]]:
    """Per KV dtype of `[[kv_sm]]`, runs [first, last, "file:line" or None] over the releases
    whose parser takes the dtype (None: that release has no such check in its source)."""
    out: dict[str, list[list[Any]]] = {}
    for spec in doc.get("kv_sm", []):
        dtype = spec["dtype"]
        runs_: list[list[Any]] = []
        for r in rels:
            if dtype not in r.kv_dtypes:
                continue
            cite = kv_sm_at(r.files, spec["message"])
            if runs_ and runs_[-1][2] == cite and runs_[-1][3] == r.place - 1:
                runs_[-1][1] = r.version
                runs_[-1][3] = r.place
            else:
                runs_.append([r.version, r.version, cite, r.place])
        out[dtype] = [run[:3] for run in runs_]
    return out


def dump_lines(lines: dict[str, list[list[str]]]) -> str:
    """constraint-lines.json as shipped: one constraint a line."""
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                      for k, v in sorted(lines.items()))
    return "{\n" + body + "\n}\n"


def release_texts() -> tuple[list[str], list[str]] | None:
    """(versions oldest first, each one's server source), or None with a line on stderr."""
    rels = load_releases()
    if rels is None:
        return None
    return [r.version for r in rels], [r.text for r in rels]


def load_releases() -> list[Release] | None:
    """Every shipped release's source, oldest first, or None with a line on stderr."""
    from sglang_guard.sglang.releases import load_release

    out: list[Release] = []
    for v in sorted(releases(), key=Version):
        found = sorted(wheel_dir().glob(f"sglang-{v}-*.whl"))
        if not found:
            print(f"missing wheel for {v}: run tools/fetch-sglang-wheels", file=sys.stderr)
            return None
        files = source_files(found[0])
        choices = load_release(v).choices
        names = frozenset(n for d in BACKEND_LISTS for n in choices.get(d, ()))
        out.append(Release(v, normalise("\n".join(files.values())), files, names,
                           frozenset(choices.get("kv_cache_dtype", ())), len(out)))
    return out


def main() -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update configs/backends.toml")
    args = ap.parse_args()
    rels = load_releases()
    if rels is None:
        return 2
    doc = tomllib.loads(TABLE.read_text(encoding="utf-8"))
    specs, lines = derive(doc, rels)
    for (name, i), spec in specs.items():
        print(f"{name}[{i}]: " + "  ".join(f"{k} {v}" for k, v in spec.items()))
    if args.write:
        TABLE.write_text(write(TABLE.read_text(encoding="utf-8"), specs), encoding="utf-8")
        LINES.write_text(dump_lines(lines), encoding="utf-8")
        MODEL_LISTS.write_text(dump_lines(model_lists(doc, rels)), encoding="utf-8")
        KV4.write_text("[\n" + ",\n".join(json.dumps(run, separators=(",", ":"))
                                           for run in kv4_runs(doc, rels)) + "\n]\n",
                       encoding="utf-8")
        KV_SM.write_text(dump_lines(kv_sm_runs(doc, rels)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
