"""What fleet memory costs a start: the lookup before the first launch, per store state.

    python bench/fleet.py [--runs N]

Times `Fleet.before_launch` (key lookup, decode, checks, apply) against a file:// store, a
real etcd (Debian's etcd-server, started here on free loopback ports, auth on), an etcd that
is down (connection refused) and one that accepts connections and never answers (the
`[learn] timeout_s` bound, 2 s). Prints the median and the worst of N runs for each. The
acceptance bound is the last row: a silent store delays a start by timeout_s, no more.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sglang_guard.config.guardconfig import LearnSection  # noqa: E402
from sglang_guard.fleet import fleet as core  # noqa: E402
from sglang_guard.fleet.shell.fleet import Fleet  # noqa: E402
from sglang_guard.fleet.shell.fleetstore import open_store  # noqa: E402
from sglang_guard.sglang.argv import parse_command_line  # noqa: E402
from sglang_guard.sglang.releases import load_option_table  # noqa: E402
from support.etcdserver import ETCD, EtcdServer  # noqa: E402

OPTIONS = load_option_table()
USER = ("--model-path", "/m", "--attention-backend", "fa3", "--port", "31000")
FIXED = ("--model-path", "/m", "--port", "31000")


def _fleet(learn: LearnSection, tmp: Path) -> Fleet:
    cl = parse_command_line(USER, OPTIONS)
    key = core.make_key(cl, sglang="0.5.23", model_config="c" * 64, draft_config=None,
                        gpu_name="NVIDIA H200", gpu_sm=90, packs=())
    f = Fleet(learn, open_store(learn), state_dir=str(tmp), key=key, options=OPTIONS,
              derived_dir=str(tmp / "derived"))
    f.quiet = True
    return f


def _seed(f: Fleet) -> None:
    edits = core.learned_edits(parse_command_line(USER, OPTIONS),
                               parse_command_line(FIXED, OPTIONS))
    f.store.put(f.name, core.Entry(f.name, "proven", edits, ("fa3-sm",), ("x",), 1,
                                   core.Origin("bench:1", "2026-12-01T00:00:00+00:00")).encode())


def _time(learn: LearnSection, tmp: Path, runs: int, seed: bool) -> tuple[float, float, str]:
    samples, result = [], ""
    for _ in range(runs):
        f = _fleet(learn, tmp)
        if seed:
            _seed(f)
        records: list[dict[str, object]] = []
        start = time.perf_counter()
        f.before_launch(parse_command_line(USER, OPTIONS), [records.append])
        samples.append(time.perf_counter() - start)
        result = str(records[0].get("result", records[0]["event"]))
    return statistics.median(samples), max(samples), result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    rows: list[tuple[str, int, tuple[float, float, str]]] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        rows.append(("file:// hit", args.runs,
                     _time(LearnSection(store=f"file://{tmp / 'fleet'}"), tmp, args.runs, True)))
        if ETCD is not None:
            server = EtcdServer(tmp).start()
            try:
                url = f"etcd://127.0.0.1:{server.client_port}/bench"
                rows.append(("etcd hit (no auth)", args.runs, _time(
                    LearnSection(store=url), tmp, args.runs, True)))
                server.enable_auth("pw")
                (tmp / "pw").write_text("pw")
                rows.append(("etcd hit (user/password)", args.runs, _time(
                    LearnSection(store=url, user="root", password_file=str(tmp / "pw")),
                    tmp, args.runs, True)))
            finally:
                server.stop()
            rows.append(("etcd down (refused)", args.runs, _time(
                LearnSection(store=url), tmp, args.runs, False)))
        with socket.socket() as hole:
            hole.bind(("127.0.0.1", 0))
            hole.listen(64)
            url = f"etcd://127.0.0.1:{hole.getsockname()[1]}/bench"
            rows.append(("etcd silent (timeout_s 2.0)", 3, _time(
                LearnSection(store=url), tmp, 3, False)))
    print(f"{'store':<30} {'runs':>4} {'median ms':>10} {'worst ms':>9}  result")
    for label, runs, (median, worst, result) in rows:
        print(f"{label:<30} {runs:>4} {median * 1000:>10.1f} {worst * 1000:>9.1f}  {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
