"""fleet/fleet.py: keys, entries, and what a fleet entry may change, over the whole option table."""

from __future__ import annotations

import contextlib
import json
import random

import pytest

from sglang_guard.fleet import fleet
from sglang_guard.rules.packcheck import DENIED_FLAGS, is_denied
from sglang_guard.rules.rules import load_default_packs
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.options import OptionSpec
from sglang_guard.sglang.releases import load_option_table

OPTIONS = load_option_table()
PACKS = load_default_packs()
CFG = "c" * 64
BASE = ("--model-path", "/models/llama", "--attention-backend", "fa3", "--tp-size", "2")


def cl(*argv: str):  # type: ignore[no-untyped-def]
    return parse_command_line(argv, OPTIONS)


def key(*argv: str, **over: object) -> str:
    facts: dict[str, object] = {"sglang": "0.5.23", "model_config": CFG, "draft_config": None,
                                "gpu_name": "NVIDIA H200", "gpu_sm": 90, "packs": PACKS}
    facts.update(over)
    return fleet.make_key(cl(*argv), **facts).digest()  # type: ignore[arg-type]


def entry(*edits: fleet.FleetEdit, status: str = "proven", k: str = "a" * 64) -> fleet.Entry:
    return fleet.Entry(k, status, edits, ("fa3-sm",), ("ValueError: fa3",), 2,
                       fleet.Origin("host-1:abcd", "2026-12-01T00:00:00+00:00", "0.5.23", "90"))


# -- keys -----------------------------------------------------------------------------------


def test_key_ignores_hosts_ports_ranks_secrets_log_paths_and_order() -> None:
    one = key(*BASE, "--host", "10.0.0.1", "--port", "30000", "--api-key", "s1",
              "--node-rank", "0", "--crash-dump-folder", "/var/a", "--nccl-port", "4000")
    two = key("--tp-size", "2", "--nccl-port", "5111", "--api-key", "other", "--port", "31000",
              "--attention-backend", "fa3", "--model-path", "/mnt/other/llama",
              "--host", "10.9.9.9", "--node-rank", "0", "--crash-dump-folder", "/tmp/b")
    assert one == two


def test_key_counts_a_secret_as_set_never_its_value() -> None:
    k = fleet.make_key(cl(*BASE, "--api-key", "sekrit-9"), sglang="0.5.23", model_config=CFG,
                       draft_config=None, gpu_name=None, gpu_sm=90, packs=PACKS)
    assert "sekrit-9" not in json.dumps(k.to_json())
    assert key(*BASE, "--api-key", "x") != key(*BASE)


@pytest.mark.parametrize("over", [
    {"sglang": "0.5.18"}, {"model_config": "d" * 64}, {"draft_config": "e" * 64},
    {"gpu_name": "NVIDIA H100 80GB HBM3"}, {"gpu_sm": 100}, {"packs": ()},
])
def test_key_changes_with_what_decides_a_fix(over: dict[str, object]) -> None:
    assert key(*BASE, **over) != key(*BASE)


def test_key_changes_with_a_flag_that_matters() -> None:
    assert key(*BASE) != key("--model-path", "/models/llama", "--attention-backend", "triton",
                             "--tp-size", "2")
    assert key(*BASE) != key(*BASE, "--enable-dp-attention")


def test_model_path_counts_when_its_config_is_unknown() -> None:
    assert key(*BASE, model_config=None) != key("--model-path", "/other", *BASE[2:],
                                                model_config=None)


def test_key_is_a_sha256_hex_digest() -> None:
    assert fleet.valid_key(key(*BASE))
    assert not fleet.valid_key("../../etc/passwd")
    assert not fleet.valid_key("A" * 64)


# -- per-host flags, over every option of the release ---------------------------------------


def _value_for(spec: OptionSpec) -> str | None:
    if not spec.takes_value:
        return None
    return spec.choices[0] if spec.choices else "1"


def test_no_entry_may_change_a_denied_or_per_host_flag_of_any_option() -> None:
    accepted = 0
    for spec in OPTIONS.options:
        flag = spec.canonical
        if not flag.startswith("--"):
            continue
        for edit in (fleet.FleetEdit(flag, "drop_flag"),
                     fleet.FleetEdit(flag, "set_flag", None, _value_for(spec))):
            found = fleet.problems(entry(edit), OPTIONS)
            if is_denied(flag) or fleet.per_host(flag, spec.dest):
                assert found, f"{flag}: accepted"
            elif not found:
                accepted += 1
    assert accepted > 200  # the rest of the table is open to fleet fixes


def test_every_denied_flag_is_refused_even_when_listed_first() -> None:
    for flag in sorted(DENIED_FLAGS):
        if OPTIONS.by_string.get(flag) is None:
            continue
        assert fleet.problems(entry(fleet.FleetEdit("--tp-size", "set_flag", "2", "1"),
                                    fleet.FleetEdit(flag, "drop_flag")), OPTIONS)


def test_allow_set_lets_a_denied_flag_through() -> None:
    edit = fleet.FleetEdit("--chat-template", "drop_flag")
    assert fleet.problems(entry(edit), OPTIONS)
    assert fleet.problems(entry(edit), OPTIONS, allow={"--chat-template"}) == []


def test_a_flag_the_release_lacks_or_a_bad_choice_is_refused() -> None:
    old = load_option_table("0.5.18")
    new_only = sorted({s.canonical for s in OPTIONS.options} - {s.canonical for s in old.options})
    flag = next(f for f in new_only if not is_denied(f) and not fleet.per_host(f))
    found = fleet.problems(entry(fleet.FleetEdit(flag, "drop_flag")), old)
    assert found and "no option" in found[0]
    bad = fleet.FleetEdit("--attention-backend", "set_flag", "fa3", "no-such-backend")
    assert "not a choice" in fleet.problems(entry(bad), OPTIONS)[0]
    assert fleet.problems(entry(fleet.FleetEdit("--attention", "drop_flag")), OPTIONS)  # abbrev


# -- learned edits, applied -----------------------------------------------------------------


@pytest.mark.parametrize(("first", "ready"), [
    (BASE, ("--model-path", "/models/llama", "--tp-size", "2")),
    (BASE, ("--model-path", "/models/llama", "--attention-backend", "triton", "--tp-size", "2")),
    (BASE, (*BASE, "--disable-cuda-graph")),
    (BASE, ("--model-path", "/models/llama", "--tp-size", "2", "--mem-fraction-static", "0.8")),
])
def test_learned_edits_applied_to_the_first_line_give_the_ready_one(
        first: tuple[str, ...], ready: tuple[str, ...], tmp_path: object) -> None:
    edits = fleet.learned_edits(cl(*first), cl(*ready))
    assert edits
    e = entry(*edits)
    assert fleet.problems(e, OPTIONS) == []
    new, why = fleet.apply_entry(cl(*first), e, OPTIONS, str(tmp_path))
    assert why is None and new is not None
    assert new.effective() == cl(*ready).effective()


def test_learned_edits_leave_out_a_picked_port() -> None:
    first = cl(*BASE, "--nccl-port", "4000")
    ready = cl(*BASE, "--nccl-port", "4123")
    assert fleet.learned_edits(first, ready) == ()


def test_an_entry_that_changes_nothing_is_not_applied(tmp_path: object) -> None:
    e = entry(fleet.FleetEdit("--attention-backend", "drop_flag", "fa3"))
    new, why = fleet.apply_entry(cl("--model-path", "/m"), e, OPTIONS, str(tmp_path))
    assert new is None and why and "nothing" in why


# -- entries from a store: schema, size, nothing else trusted -------------------------------


def test_entry_round_trip() -> None:
    e = entry(fleet.FleetEdit("--attention-backend", "drop_flag", "fa3"), k="b" * 64)
    again = fleet.decode_entry(e.encode(), "b" * 64)
    assert again == e
    assert again.confirmed().confirmations == 1
    bad = again.known_bad("host-2:ffff")
    assert bad.status == "known_bad" and bad.failed_by == ("host-2:ffff",)


@pytest.mark.parametrize(("mutate", "why"), [
    (lambda d: d.update(schema=2), "schema"),
    (lambda d: d.update(key="c" * 64), "another key"),
    (lambda d: d.update(status="maybe"), "status"),
    (lambda d: d.update(edits=[]), "edits"),
    (lambda d: d["edits"][0].update(action="rm -rf"), "action"),
    (lambda d: d["edits"][0].update(extra="x"), "edit"),
    (lambda d: d["edits"][0].update(flag="attention-backend"), "flag"),
    (lambda d: d.update(launches=True), "launches"),
    (lambda d: d.update(confirmations=-1), "confirmations"),
    (lambda d: d.update(origin="me"), "origin"),
    (lambda d: d.update(lines=["x"] * 9), "lines"),
])
def test_a_malformed_entry_is_refused(mutate, why: str) -> None:  # type: ignore[no-untyped-def]
    data = entry(fleet.FleetEdit("--attention-backend", "drop_flag", "fa3"), k="b" * 64).to_json()
    mutate(data)
    with pytest.raises(ValueError, match=why):
        fleet.decode_entry(json.dumps(data).encode(), "b" * 64)


def test_an_oversized_entry_is_refused_unread() -> None:
    with pytest.raises(ValueError, match="limit"):
        fleet.decode_entry(b" " * (fleet.MAX_ENTRY_BYTES + 1), "b" * 64)


def test_random_bytes_and_mutations_only_ever_raise_value_error() -> None:
    good = entry(fleet.FleetEdit("--attention-backend", "drop_flag", "fa3"), k="b" * 64).encode()
    rng = random.Random(25)  # noqa: S311 - a reproducible fuzz, not a secret
    for _ in range(3000):
        raw = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        with contextlib.suppress(ValueError):
            fleet.decode_entry(bytes(raw), "b" * 64)


def test_secrets_in_lines_are_masked() -> None:
    lines = fleet.fatal_lines(["error: bad key api_key=sekrit-9 given"] * 3)
    assert len(lines) == 1 and "sekrit-9" not in lines[0]
