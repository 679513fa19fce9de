"""status/shell/statusserver.py's connection book: the cap, the oldest idle closed first."""

from __future__ import annotations

import socket

from sglang_guard.status.shell.statusserver import MAX_CONNECTIONS, Connections, connection_cap


def test_the_oldest_idle_connection_makes_room_and_busy_ones_never_do() -> None:
    book = Connections(cap=3)
    pairs = [socket.socketpair() for _ in range(5)]
    try:
        a, b, c, d, e = (p[0] for p in pairs)
        assert book.admit(a) and book.admit(b) and book.admit(c)
        book.busy(a)  # a has a whole request in: it is answered, never closed for another
        assert book.admit(d)  # b, the oldest idle one, goes
        assert book.evicted == 1 and len(book) == 3
        assert pairs[1][1].recv(1) == b""  # b's peer sees the connection end
        book.busy(c)
        book.busy(d)
        assert not book.admit(e)  # all busy: the new one is refused, nothing is closed
        assert book.refused == 1 and len(book) == 3
        book.idle(c)
        book.gone(a)
        assert book.admit(e) and len(book) == 3 and book.evicted == 1
    finally:
        for x, y in pairs:
            x.close()
            y.close()


def test_a_low_fd_limit_lowers_the_cap_and_leaves_the_guard_its_fds() -> None:
    assert connection_cap(1 << 20) == MAX_CONNECTIONS
    assert connection_cap(256) == MAX_CONNECTIONS
    assert connection_cap(200) == 36
    assert connection_cap(64) == 4
