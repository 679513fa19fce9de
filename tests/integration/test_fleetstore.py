"""fleet/shell/fleetstore.py against a real etcd server and a real directory."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_guard.config.guardconfig import LearnSection
from sglang_guard.errors import InputError
from sglang_guard.fleet.shell import fleetstore
from sglang_guard.fleet.shell.fleetstore import EtcdStore, FileStore, StoreError, open_store
from support.etcdserver import ETCD, EtcdServer, make_certs
from support.procs import free_port

K1, K2 = "1" * 64, "2" * 64
needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd-server is not installed")


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path).start()
    yield server
    server.stop()


def _etcd_store(server: EtcdServer, **learn: object) -> fleetstore.Store:
    url = f"etcd://127.0.0.1:{server.client_port}/fleet-test"
    return open_store(LearnSection(store=url, **learn))  # type: ignore[arg-type]


def _round_trip(store: fleetstore.Store) -> None:
    assert store.get(K1) is None
    store.put(K1, b'{"a": 1}')
    store.put(K2, b'{"b": 2}')
    assert store.get(K1) == b'{"a": 1}'
    assert store.names() == [K1, K2]
    assert store.delete(K1)
    assert not store.delete(K1)
    assert store.names() == [K2]
    with pytest.raises(StoreError, match="not a fleet key"):
        store.get("../../etc/passwd")


@needs_etcd
def test_etcd_round_trip_under_the_prefix_with_a_lease(etcd: EtcdServer) -> None:
    store = _etcd_store(etcd, ttl_days=1.0)
    _round_trip(store)
    got = etcd.call("/v3/kv/range", {"key": "L2ZsZWV0LXRlc3Qv", "range_end": "L2ZsZWV0LXRlc3Qw"})
    assert got["count"] == "1"  # only /fleet-test/<key>
    lease = got["kvs"][0]["lease"]
    ttl = etcd.call("/v3/lease/timetolive", {"ID": lease})
    assert 86000 < int(ttl["TTL"]) <= 86400


@needs_etcd
def test_etcd_with_auth_needs_the_password(etcd: EtcdServer, tmp_path: Path) -> None:
    etcd.enable_auth("pw-1")
    secret = tmp_path / "pw"
    secret.write_text("pw-1\n")
    store = _etcd_store(etcd, user="root", password_file=str(secret))
    _round_trip(store)
    secret.write_text("wrong\n")
    with pytest.raises(StoreError):
        _etcd_store(etcd, user="root", password_file=str(secret)).put(K1, b"{}")
    with pytest.raises(StoreError):  # no credentials at all: unauthenticated writers refused
        _etcd_store(etcd).put(K1, b"{}")


@needs_etcd
def test_etcd_second_endpoint_answers_when_the_first_is_down(etcd: EtcdServer) -> None:
    dead = free_port()
    url = f"etcd://127.0.0.1:{dead},127.0.0.1:{etcd.client_port}/p"
    store = open_store(LearnSection(store=url))
    store.put(K1, b"{}")
    assert store.get(K1) == b"{}"


def test_etcd_down_is_a_store_error_within_the_timeout() -> None:
    store = EtcdStore(fleetstore.EtcdAddress((f"http://127.0.0.1:{free_port()}",), "/p/"),
                      ttl_s=60, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(StoreError, match="unreachable"):
        store.get(K1)
    assert time.monotonic() - start < 2.0


def test_file_store_round_trip_private_files(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "fleet"), ttl_s=3600)
    _round_trip(store)
    assert (tmp_path / "fleet").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "fleet" / f"{K2}.json").stat().st_mode & 0o777 == 0o600
    assert not [p for p in (tmp_path / "fleet").iterdir() if p.name.endswith(".tmp")]


def test_file_store_entry_past_its_ttl_is_gone(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "fleet"), ttl_s=3600)
    store.put(K1, b"{}")
    old = time.time() - 7200
    os.utime(tmp_path / "fleet" / f"{K1}.json", (old, old))
    assert store.get(K1) is None


def test_file_store_refuses_what_others_may_write(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "fleet"), ttl_s=3600)
    store.put(K1, b"{}")
    (tmp_path / "fleet" / f"{K1}.json").chmod(0o666)
    with pytest.raises(StoreError, match="writable by group or others"):
        store.get(K1)
    (tmp_path / "fleet").chmod(0o777)
    with pytest.raises(StoreError, match="writable by group or others"):
        store.names()
    (tmp_path / "fleet").chmod(0o700)


def test_file_store_refuses_a_planted_symlink(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "fleet"), ttl_s=3600)
    store.put(K2, b"{}")
    target = tmp_path / "elsewhere"
    target.write_text("{}")
    (tmp_path / "fleet" / f"{K1}.json").symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        store.get(K1)


@pytest.mark.parametrize(("url", "why"), [
    ("file://relative/dir", "absolute"),
    ("etcd://", "HOST:PORT"),
    ("etcd://user:pw@10.0.0.1:2379/p", "credentials"),
    ("redis://x", "expected"),
])
def test_bad_store_addresses(url: str, why: str) -> None:
    with pytest.raises(InputError, match=why):
        fleetstore.parse_store_url(url)


def test_etcd_address_forms() -> None:
    kind, where = fleetstore.parse_store_url("etcds://a:2379,b:2379/team/llama")
    assert kind == "etcd"
    assert where == fleetstore.EtcdAddress(("https://a:2379", "https://b:2379"), "/team/llama/")


@needs_etcd
def test_a_guard_with_a_user_refuses_an_etcd_whose_auth_is_off(etcd: EtcdServer,
                                                               tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    with pytest.raises(StoreError, match="authentication is not enabled"):
        _etcd_store(etcd, user="root", password_file=str(secret)).get(K1)


@needs_etcd
def test_etcds_with_a_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    server = EtcdServer(tmp_path, tls=certs).start()
    try:
        url = f"etcds://127.0.0.1:{server.client_port}/tls"
        store = open_store(LearnSection(store=url, ca_file=str(certs / "ca.pem"),
                                        cert_file=str(certs / "client.pem"),
                                        key_file=str(certs / "client-key.pem")))
        _round_trip(store)
        with pytest.raises(StoreError):  # no client certificate: the TLS handshake fails
            open_store(LearnSection(store=url, ca_file=str(certs / "ca.pem"))).get(K1)
        with pytest.raises(StoreError):  # a server the CA did not sign
            open_store(LearnSection(store=url)).get(K1)
    finally:
        server.stop()


def _count_up(store: fleetstore.Store, writers: int) -> int:
    """`writers` threads each add 1 to a JSON counter through `update`; the final count."""
    start = threading.Barrier(writers)

    def add(raw: bytes | None) -> bytes:
        n = json.loads(raw)["n"] if raw else 0
        return json.dumps({"n": n + 1}).encode()

    def work() -> None:
        start.wait()
        store.update(K1, add)

    threads = [threading.Thread(target=work) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return int(json.loads(store.get(K1) or b"{}")["n"])


def test_file_store_updates_lose_nothing_under_concurrent_writers(tmp_path: Path) -> None:
    assert _count_up(FileStore(str(tmp_path / "fleet"), 3600), 12) == 12


@needs_etcd
def test_etcd_updates_are_compare_and_swap_and_leave_one_lease(etcd: EtcdServer) -> None:
    store = fleetstore.EtcdStore(fleetstore.EtcdAddress((etcd.url,), "/cas/"), ttl_s=600,
                                 timeout_s=5.0)
    # Writers that lose a round retry (UPDATE_ATTEMPTS, jittered): every one lands.
    assert _count_up(store, 8) == 8
    leases = etcd.call("/v3/lease/leases", {}).get("leases") or []
    assert len(leases) == 1  # each replaced entry's lease was revoked
