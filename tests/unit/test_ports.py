"""Internal ports in use: the rules that read them, the `free_port` fix, and the port picked.

Lines are SGLang's and torch's own (tests/data/sglang-messages-0.5.23.toml): the TCPStore
line is the one SGLang 0.5.23 printed on CPU with a busy --nccl-port.
"""

from __future__ import annotations

import random
import socket
from dataclasses import replace
from typing import Any

import pytest

from sglang_guard.config.guardconfig import HealthSection, RestartSection
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK, ConfigError
from sglang_guard.rules.packcheck import check_pack
from sglang_guard.rules.rules import (
    Fix,
    MatchContext,
    Matcher,
    first_fix,
    load_default_packs,
    parse_pack,
)
from sglang_guard.rules.shell.explain import fix_as_dict, render_fix
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.status.status import phase_of
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Action, Exit, Journal, PickPort, Spawn, Stop
from sglang_guard.supervise.events import ChildExited, ChildLine, PortChosen, SignalReceived
from sglang_guard.supervise.replay import env_for, replay
from sglang_guard.supervise.shell import ports
from support.sglang import WHEELS_MISSING, missing

OPTIONS = load_option_table()
MATCHER = Matcher(load_default_packs())
TCPSTORE = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 37465, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use")
CLASSIC = ("RuntimeError: The server socket has failed to listen on any local network address. "
           "The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in "
           "use). The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address "
           "already in use).")
BANNER = ("[2026-11-29 15:40:02] Port is already in use. dist_init_port=30234 port_base=30235 "
          "detokenizer_port=30236 nccl_port=30002 scheduler_input_port=30239")
NCCL_WAIT = ("ValueError: nccl_port at 30002 is not available in 30 seconds. nccl_port is used "
             "by a process already. process.name()='python3' pid=4242")
DETOK_WAIT = "ValueError: detokenizer_port at 30236 is not available in 30 seconds. x"
ZMQ = "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:30236')"
HTTP = ("[2026-11-29 15:40:02] ERROR:    [Errno 98] error while attempting to bind on address "
        "('127.0.0.1', 30000): address already in use")


def _ctx(flags: dict[str, str | None], **kw: Any) -> MatchContext:
    return MatchContext(flags=flags, arch="mha", sm=None, sglang_version="0.5.23",
                        options=kw.pop("options", OPTIONS), **kw)


def _fix(line: str, flags: dict[str, str | None], **kw: Any) -> Fix | None:
    return first_fix(MATCHER, line, _ctx(flags, **kw), {})[0]


# --- planning (pure) -----------------------------------------------------------------------


def test_busy_nccl_port_from_the_tcpstore_is_moved_to_a_free_port() -> None:
    fix = _fix(TCPSTORE, {"--nccl-port": "37465", "--port": "30000"})
    assert fix is not None and fix.rule.id == "nccl-port-in-use"
    assert (fix.action, fix.flag, fix.old_value) == ("set_flag", "--nccl-port", "37465")
    assert fix.free_port and fix.busy_port == 37465
    assert fix.new_value is None  # the shell picks the number, not the core


def test_a_busy_port_that_is_not_the_nccl_ports_changes_nothing_there() -> None:
    assert _fix(TCPSTORE, {"--nccl-port": "29500"}) is None


def test_an_nccl_port_sglang_chose_itself_is_set_explicitly() -> None:
    fix = _fix(TCPSTORE, {"--port": "30000"})
    assert fix is not None and fix.flag == "--nccl-port" and fix.old_value is None
    assert fix.free_port


def test_the_classic_tcpstore_wording_names_the_port_too() -> None:
    fix = _fix(CLASSIC, {"--nccl-port": "29500"})
    assert fix is not None and fix.free_port and fix.busy_port == 29500


def test_a_dist_init_addr_port_is_the_groups_and_gives_up_naming_it() -> None:
    fix = _fix(TCPSTORE.replace("37465", "5000"),
               {"--dist-init-addr": "10.0.0.1:5000", "--nnodes": "2", "--nccl-port": "5000"})
    assert fix is not None and fix.action == "give_up" and fix.flag is None
    assert fix.rule.id == "dist-init-addr-port-in-use"
    assert "(5000," in fix.diagnosis and "every node" in fix.diagnosis


def test_a_release_without_the_flag_gets_no_fix() -> None:
    lacking = replace(OPTIONS, by_string={k: v for k, v in OPTIONS.by_string.items()
                                          if k != "--nccl-port"})
    assert _fix(TCPSTORE, {}, options=lacking) is None


def test_sglangs_own_port_check_moves_the_nccl_port_and_names_the_others() -> None:
    fix = _fix(NCCL_WAIT, {"--nccl-port": "30002"})
    assert fix is not None and fix.rule.id == "nccl-port-not-available" and fix.free_port
    derived = _fix(DETOK_WAIT, {"--port": "30001"})
    assert derived is not None and derived.action == "give_up"
    assert derived.rule.id == "derived-port-not-available"
    assert derived.diagnosis.startswith("detokenizer_port (30236) is busy")
    grouped = _fix(DETOK_WAIT, {"--dist-init-addr": "10.0.0.1:5000"})
    assert grouped is not None and grouped.rule.id == "dist-init-derived-port-not-available"
    # nccl_port with --dist-init-addr: no fix on one node; the generic give-up names it.
    other = _fix(NCCL_WAIT, {"--dist-init-addr": "10.0.0.1:5000", "--nccl-port": "30002"})
    assert other is not None and other.rule.id == "port-not-available"
    assert "nccl_port at 30002" in other.diagnosis


def test_the_port_check_banner_waits_for_the_line_that_names_the_port() -> None:
    banner = _fix(BANNER, {"--nccl-port": "30002"})
    assert banner is not None and banner.action == "give_up" and banner.rule.priority < 0
    # As SGLang 0.5.23 prints it (tests/data/sglang-logs/llama-dp-busy-nccl-port.log): the
    # banner is a logger.exception record, its traceback ends with the line naming the port.
    burst = [BANNER, "Traceback (most recent call last):",
             '  File "sglang/srt/server_args.py", line 875, in init_new',
             '    wait_port_available(nccl_port, "nccl_port")', NCCL_WAIT]
    cl = parse_command_line(("--model-path", "/m", "--nccl-port", "30002"), OPTIONS)
    fix = replay(burst, env_for(MATCHER, OPTIONS, sglang_version="0.5.23", arch="mha"), cl)
    assert fix is not None and fix.rule.id == "nccl-port-not-available"


def test_the_port_check_is_no_rule_of_releases_before_it() -> None:
    ctx = MatchContext(flags={"--nccl-port": "30002"}, arch="mha", sm=None,
                       sglang_version="0.5.4", options=OPTIONS)
    fix = first_fix(MATCHER, NCCL_WAIT, ctx, {})[0]
    assert fix is not None and fix.rule.id == "port-not-available"  # generic, no move


def test_zmq_and_http_ports_give_up_and_never_touch_port() -> None:
    zmq = _fix(ZMQ, {"--port": "30001"})
    assert zmq is not None and zmq.action == "give_up"
    assert "tcp://127.0.0.1:30236" in zmq.diagnosis
    http = _fix(HTTP, {"--port": "30000", "--nccl-port": "30000"})
    assert http is not None and http.rule.id == "http-port-in-use" and http.flag is None
    assert "clients point at it" in http.rule.reason


def test_explain_says_a_free_port_is_picked() -> None:
    fix = _fix(TCPSTORE, {"--nccl-port": "37465"})
    assert render_fix(fix) == ("fix: set --nccl-port to a free port, picked at the next launch "
                               "(nccl-port-in-use)")
    shown = fix_as_dict(fix)
    assert shown is not None and shown["free_port"] is True and shown["busy_port"] == 37465


# --- the pack format and the deny list ------------------------------------------------------

_HEAD = '[pack]\nname = "p"\nsglang_versions = ">=0.5.23"\n[[rules]]\nid = "r"\n'


@pytest.mark.parametrize(("body", "problem"), [
    ('pattern = "x"\naction = "rewrite_value"\nflags = ["--nccl-port"]\nnew_value = "free_port"',
     "set_flag only"),
    ('pattern = "x"\naction = "set_flag"\nflags = ["--nccl-port"]\nnew_value = "free_port:p"',
     "no group (?P<p>"),
    ('pattern = "(?P<p>x)"\naction = "set_flag"\nflags = ["--nccl-port"]\n'
     'new_value = "free_port:p"\nmaximum = 3', "no default/minimum/maximum"),
])
def test_free_port_rules_are_checked_on_the_way_in(body: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace("?", r"\?")):
        parse_pack(_HEAD + body, "p.toml")


def test_free_port_moves_only_an_internal_port() -> None:
    ok = parse_pack(_HEAD + 'pattern = "x"\naction = "set_flag"\nflags = ["--nccl-port"]\n'
                    'new_value = "free_port"', "p.toml")
    assert check_pack(ok, OPTIONS) is ok
    fixed = parse_pack(_HEAD + 'pattern = "x"\naction = "set_flag"\nflags = ["--nccl-port"]\n'
                       'new_value = "29500"', "p.toml")
    with pytest.raises(ConfigError, match="deny list"):
        check_pack(fixed, OPTIONS)  # a value of the rule's own: still denied
    for flag in ("--port", "--dist-init-addr"):
        http = parse_pack(_HEAD + f'pattern = "x"\naction = "set_flag"\nflags = ["{flag}"]\n'
                          'new_value = "free_port"', "p.toml")
        with pytest.raises(ConfigError, match=f"free_port moves only an internal port.*{flag}"):
            check_pack(http, OPTIONS, allow=[flag])  # not even when the config allows the flag


# --- the machine: stop, pick once the tree is gone, launch with the port -------------------

ARGV = ("--model-path", "/m", "--port", "31000", "--nccl-port", "37465")


def _env() -> machine.Env:
    return machine.Env(options=OPTIONS, matcher=MATCHER, restart=RestartSection(),
                       health=HealthSection(), arch="mha", sm=None, sglang_version="0.5.23",
                       derived_dir="/tmp/derived")


def _records(actions: list[Action], event: str) -> list[dict[str, Any]]:
    return [a.record.to_record() for a in actions if isinstance(a, Journal)
            and a.record.event == event]


class _Run:
    def __init__(self, argv: tuple[str, ...] = ARGV) -> None:
        self.env = _env()
        self.state, self.first = machine.start(
            machine.State(cl=parse_command_line(argv, OPTIONS)), self.env)

    def send(self, event: Any) -> list[Action]:
        self.state, actions = machine.step(self.state, event, self.env, 1000.0, 0.5)
        return actions

    def fail_on(self, line: str) -> PickPort:
        stop = self.send(ChildLine(self.state.gen, "stderr", line, len(line)))
        assert [type(a) for a in stop] == [Stop], stop  # nothing journaled until the port
        picks = [a for a in self.send(ChildExited(self.state.gen, 42, 137))
                 if isinstance(a, PickPort)]
        assert len(picks) == 1 and self.state.phase == "picking"
        return picks[0]


def test_the_fix_waits_for_the_shells_port_then_launches_with_it() -> None:
    run = _Run()
    pick = run.fail_on(TCPSTORE)
    assert pick == PickPort(1, "--nccl-port", (31000, 37465))
    assert phase_of(run.state.phase, None) == "starting"
    actions = run.send(PortChosen(1, "--nccl-port", 23456))
    spawn = next(a for a in actions if isinstance(a, Spawn))
    assert spawn.gen == 2 and spawn.argv == ("--model-path", "/m", "--port", "31000",
                                             "--nccl-port", "23456")
    [fix] = _records(actions, "remediated")
    assert (fix["flag"], fix["old_value"], fix["new_value"]) == ("--nccl-port", "37465", "23456")
    assert fix["free_port"] is True and fix["busy_port"] == 37465
    assert fix["rule"] == "nccl-port-in-use" and fix["gen"] == 1 and fix["line"] == TCPSTORE
    assert run.state.before_fix is not None and run.state.before_fix[1] == "--nccl-port"


def test_an_nccl_port_sglang_derived_is_added_to_the_command_line() -> None:
    run = _Run(("--model-path", "/m", "--port", "31000"))
    assert run.fail_on(TCPSTORE).avoid == (31000, 37465)
    spawn = next(a for a in run.send(PortChosen(1, "--nccl-port", 24000))
                 if isinstance(a, Spawn))
    assert spawn.argv[-2:] == ("--nccl-port", "24000")


def test_no_free_port_gives_up_with_the_reason() -> None:
    run = _Run()
    run.fail_on(TCPSTORE)
    actions = run.send(PortChosen(1, "--nccl-port", None, "no free port found"))
    assert not [a for a in actions if isinstance(a, Spawn)]
    [done] = [a for a in actions if isinstance(a, Exit)]
    assert done.code == EXIT_GIVE_UP and "no free port found" in done.reason
    assert _records(actions, "give_up") and run.state.phase == "done"


def test_a_stale_answer_or_a_signal_while_picking_launches_nothing() -> None:
    run = _Run()
    run.fail_on(TCPSTORE)
    assert run.send(PortChosen(0, "--nccl-port", 23456)) == []  # another launch's answer
    assert run.send(PortChosen(1, "--port", 23456)) == []  # not the flag asked for
    actions = run.send(SignalReceived(15))
    assert [a.code for a in actions if isinstance(a, Exit)] == [EXIT_OK]
    assert run.send(PortChosen(1, "--nccl-port", 23456)) == []


def test_a_group_port_give_up_journals_the_port_it_names() -> None:
    run = _Run(("--model-path", "/m", "--dist-init-addr", "10.0.0.1:5000", "--nnodes", "2"))
    line = TCPSTORE.replace("37465", "5000")
    actions = run.send(ChildLine(run.state.gen, "stderr", line, len(line)))
    [planned] = _records(actions, "give_up.planned")
    assert planned["rule"] == "dist-init-addr-port-in-use" and "(5000," in planned["reason"]


# --- the shell's choice ---------------------------------------------------------------------


def test_a_picked_port_is_below_the_ephemeral_range_and_not_avoided() -> None:
    seen: list[int] = []

    def free(port: int) -> bool:
        seen.append(port)
        return len(seen) >= 3  # the first two candidates are busy

    port = ports.pick_free_port({22000, 22001}, rng=random.Random(7),  # noqa: S311 - a port
                                is_free=free,
                                low_ephemeral=32768)
    assert port == seen[-1] and len(seen) == 3
    assert all(ports.PICK_LOW <= p <= ports.PICK_HIGH and p not in (22000, 22001) for p in seen)


def test_without_room_below_the_ephemeral_range_the_kernel_picks() -> None:
    port = ports.pick_free_port((), is_free=lambda p: p == 41000, kernel_port=lambda: 41000,
                                low_ephemeral=ports.PICK_LOW)
    assert port == 41000


def test_nothing_free_is_an_oserror() -> None:
    with pytest.raises(OSError, match="no free port"):
        ports.pick_free_port((), is_free=lambda p: False, kernel_port=lambda: 41000)


def test_a_port_held_by_a_loopback_listener_is_not_picked() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        assert not ports._bindable(busy)  # the TCPStore binds every address: it collides
        port = ports.pick_free_port((busy,))
        assert port != busy
        with socket.socket() as probe:  # bindable now, on every IPv4 address
            probe.bind(("0.0.0.0", port))  # noqa: S104
    assert ports.ephemeral_low("/nonexistent") == 32768


# --- every release's file:line, and the hand-written ranges, against the wheels --------------

_WHEEL_TOOL = __import__("importlib.util").util
_REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
# What a cited line of each kind holds; a rule's citations of a kind cover its releases.
_CITES: dict[str, tuple[str, ...]] = {
    "nccl-port-in-use": ("dist_port",),
    "dist-init-addr-port-in-use": ("dist_init_method =",),
    "internal-port-in-use": ("Port is already in use",),
    "nccl-port-not-available": ('wait_port_available(nccl_port, "nccl_port")',
                                "is not available in"),
    "derived-port-not-available": ("server_args.port + ZMQ_TCP_PORT_DELTA",
                                   "Port is already in use", "is not available in"),
    "dist-init-derived-port-not-available": ("Port is already in use", "is not available in"),
    "port-not-available": ("is not available in",),
    "zmq-port-in-use": ("socket.bind(endpoint)",),
}
# The statement whose first release is the start of a hand-written `>=` range.
_RANGE_FROM = {"internal-port-in-use": "Port is already in use. ",
               "nccl-port-not-available": 'wait_port_available(nccl_port, "nccl_port")',
               "derived-port-not-available": "Port is already in use. ",
               "dist-init-derived-port-not-available": "Port is already in use. "}
_CITE = __import__("re").compile(r"(sglang/srt/\S+?\.py)?:(\d+) \(([^)]+)\)")


def _releases() -> list[str]:
    from packaging.version import Version  # noqa: PLC0415

    text = (_REPO / "configs" / "sglang" / "releases.txt").read_text(encoding="utf-8")
    return sorted((v.strip() for v in text.splitlines() if v.strip() and v[0] != "#"),
                  key=Version)


@pytest.fixture(scope="module")
def wheels() -> dict[str, Any]:
    import zipfile  # noqa: PLC0415

    spec = _WHEEL_TOOL.spec_from_file_location("cr", _REPO / "tools" / "constraint_ranges.py")
    assert spec is not None and spec.loader is not None
    tool = _WHEEL_TOOL.module_from_spec(spec)
    spec.loader.exec_module(tool)
    found = {v: sorted(tool.wheel_dir().glob(f"sglang-{v}-*.whl")) for v in _releases()}
    if not all(found.values()):
        missing(WHEELS_MISSING)
    return {v: zipfile.ZipFile(w[0]) for v, w in found.items()}


def _span(text: str, order: list[str]) -> list[str]:
    first, _, last = text.partition("-")
    return order[order.index(first):order.index(last or first) + 1]


@pytest.mark.parametrize("rid", sorted(_CITES))
def test_each_release_is_cited_at_a_line_that_holds_it(rid: str, wheels: dict[str, Any]) -> None:
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415

    order = _releases()
    rule = next(r for r in MATCHER.rules if r.id == rid)
    covers = [v for v in order if rule.conditions.sglang is None
              or v in SpecifierSet(rule.conditions.sglang)]
    cited: dict[str, set[str]] = {token: set() for token in _CITES[rid]}
    path = ""
    for m in _CITE.finditer(rule.source or ""):
        path = m.group(1) or path
        for v in _span(m.group(3), order):
            line = wheels[v].read(path).decode().splitlines()[int(m.group(2)) - 1]
            held = [t for t in _CITES[rid] if t in line]
            assert held, f"{rid}: {path}:{m.group(2)} in {v} is {line.strip()!r}"
            cited[held[0]].add(v)
    for token, releases in cited.items():
        assert set(covers) <= releases, f"{rid}: {token!r} not cited for " \
            f"{sorted(set(covers) - releases)}"
    if rid in _RANGE_FROM:  # the hand-written range is exactly where SGLang has the check
        has = [v for v in order if _RANGE_FROM[rid] in
               wheels[v].read("sglang/srt/server_args.py").decode()]
        assert has == covers, f"{rid}: range {rule.conditions.sglang} but the check is in {has}"
