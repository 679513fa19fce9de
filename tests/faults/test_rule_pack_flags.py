"""Rule packs checked against SGLang's option table at start and on reload (issue 10, item 4).

Before the check, each bad pack here loaded fine: an unknown or ambiguous flag crashed the
guard with KeyError (exit 70, SGLang killed) when its line appeared, and a denied flag was
applied on restart. Now the guard refuses the pack before launching anything (exit 2, one
line naming the pack, the rule id and the key), and a reload to such a pack is rejected.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sglang_guard.errors import EXIT_OK, EXIT_USAGE
from sglang_guard.supervise.machine import READY_LINE
from support.guards import Guard, argv_for, finish, guard_toml
from support.harness import HealthServer, Launcher, count, journal_events, ready_then_wait, wait_for
from support.pack import FA3_LINE, PACK_TEXT
from support.procs import free_port

MARK = "ValueError: pack check marker line"


def bad_rule(rule_id: str, action: str, flag: str, new_value: str | None = None) -> str:
    """A rule that fires on MARK and changes `flag`."""
    text = (f"\n[[rules]]\nid = {json.dumps(rule_id)}\npattern = 'pack check marker line'\n"
            f"action = {json.dumps(action)}\nflags = [{json.dumps(flag)}]\n")
    return text + (f"new_value = {json.dumps(new_value)}\n" if new_value is not None else "")


BAD = [
    pytest.param("unknown", "drop_flag", "--no-such-flag", None, "has no option --no-such-flag",
                 id="unknown-flag"),
    pytest.param("ambiguous", "set_flag", "--cuda-graph-max-bs", "8", "is ambiguous",
                 id="ambiguous-flag"),
    pytest.param("api-key", "set_flag", "--api-key", "attacker", "deny list", id="denied-api-key"),
    pytest.param("host", "rewrite_value", "--host", "0.0.0.0",  # noqa: S104 - the attack
                 "deny list", id="denied-host"),
    pytest.param("remote-code", "set_flag", "--trust-remote-code", None, "deny list",
                 id="denied-trust-remote-code"),
    pytest.param("bad-choice", "set_flag", "--attention-backend", "no_such_backend",
                 "is not a choice of --attention-backend", id="bad-choice"),
]


@pytest.mark.parametrize(("rule_id", "action", "flag", "new_value", "problem"), BAD)
def test_a_bad_pack_exits_2_before_launching(
        tmp_path: Path, pack: Path, guard: Guard,
        rule_id: str, action: str, flag: str, new_value: str | None, problem: str) -> None:
    pack.write_text(PACK_TEXT + bad_rule(rule_id, action, flag, new_value))
    # Were the pack accepted, this child would print the line and the rule would act.
    launcher = Launcher(tmp_path, [[["print", "stderr", MARK], ["exit", 1]]])
    code, _, err = finish(guard(guard_toml(tmp_path, launcher, pack), argv_for(free_port())))
    assert code == EXIT_USAGE, err
    assert f"rules[{rule_id}]" in err, err
    assert str(pack) in err and "pack 'test'" in err, err
    assert problem in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert launcher.argvs() == []  # nothing was launched


def test_allow_set_in_the_guard_config_lets_a_denied_flag_through(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    pack.write_text(PACK_TEXT + bad_rule("served-name", "set_flag", "--host", "127.0.0.1"))
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    config = guard_toml(tmp_path, launcher, pack)
    config.write_text(config.read_text().replace(
        "[rules]\n", '[rules]\nallow_set = ["--host"]\n'))
    code, _, err = finish(guard(config, argv_for(free_port())))
    assert code != EXIT_USAGE, err  # the pack loaded: the child ran (and exited)
    assert len(launcher.argvs()) == 1


def test_allow_set_naming_an_unknown_flag_exits_2(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    launcher = Launcher(tmp_path, [[["exit", 0]]])
    config = guard_toml(tmp_path, launcher, pack)
    config.write_text(config.read_text().replace(
        "[rules]\n", '[rules]\nallow_set = ["--hostt"]\n'))
    code, _, err = finish(guard(config, argv_for(free_port())))
    assert code == EXIT_USAGE, err
    assert "rules.allow_set" in err and "--hostt" in err, err
    assert launcher.argvs() == []


def test_reload_to_a_pack_with_an_ambiguous_flag_is_rejected_and_the_old_pack_serves(
        tmp_path: Path, pack: Path, guard: Guard) -> None:
    gate = tmp_path / "gate"
    launcher = Launcher(tmp_path, [
        [["print", "stdout", READY_LINE], ["wait_file", str(gate)], ["print", "stderr", MARK],
         ["print", "stderr", FA3_LINE], ["exit", 1]],
        ready_then_wait(),
    ])
    state = tmp_path / "state"
    with HealthServer() as server:
        argv = argv_for(server.port, "--attention-backend", "fa3")
        proc = guard(guard_toml(tmp_path, launcher, pack, max_failures=3), argv)
        wait_for(lambda: count(state, "ready") >= 1, what="ready")
        pack.write_text(PACK_TEXT + bad_rule("ambiguous", "set_flag", "--cuda-graph-max-bs", "8"))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: count(state, "reload.rejected") >= 1, what="reload.rejected")
        gate.write_text("")  # now the child prints the line the rejected rule would match
        wait_for(lambda: count(state, "ready") >= 2, what="ready after the fa3 fix")
        proc.send_signal(signal.SIGINT)
        code, _, err = finish(proc)
    assert code == EXIT_OK, err
    records = journal_events(state)
    rejected = next(r for r in records if r["event"] == "reload.rejected")
    assert "rules[ambiguous].flags" in rejected["error"], rejected
    assert "is ambiguous" in rejected["error"], rejected
    fixes = [r for r in records if r["event"] == "remediated"]
    assert [f["rule"] for f in fixes] == ["fa3-sm"], fixes  # the last good pack kept acting
    assert records[-1]["event"] == "guard.exit" and records[-1]["code"] == EXIT_OK
