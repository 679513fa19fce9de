"""Issue 24: the pumps' writer writes a chunk in C (`linescan.write_pieces`), WRITE_PIECE
bytes per write(2) with the GIL released over all of them; it loses no byte on short writes,
stops at EAGAIN saying how much went out, and raises OSError for any other error.
tests/integration/test_child.py runs it under a real child with a file sink."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import threading

import pytest

from sglang_guard.rules import linescan

pytestmark = pytest.mark.skipif(linescan.write_pieces is None,
                                reason="the C line search is not built here")


def drain(fd: int, into: bytearray) -> None:
    while block := os.read(fd, 65536):
        into += block


@pytest.mark.parametrize("piece", [1, 7, 4096, 32 * 1024, 1 << 30])
def test_every_byte_goes_out_in_order_through_a_pipe_that_fills(piece: int) -> None:
    """Through a pipe (64 KiB) the writes block and come back short: all of it arrives."""
    assert linescan.write_pieces is not None
    data = random.Random(piece).randbytes(3 * 1024 * 1024 + 5)  # noqa: S311 - test data
    if piece == 1:
        data = data[:20000]
    r, w = os.pipe()
    got = bytearray()
    reader = threading.Thread(target=drain, args=(r, got))
    reader.start()
    try:
        assert linescan.write_pieces(w, data, piece) == len(data)
    finally:
        os.close(w)
        reader.join(30)
        os.close(r)
    assert bytes(got) == data


def test_a_full_non_blocking_pipe_stops_it_and_says_how_much_went_out() -> None:
    assert linescan.write_pieces is not None
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
        data = bytes(range(256)) * 4096  # 1 MiB: more than the pipe holds
        done = linescan.write_pieces(w, data, 32 * 1024)
        assert 0 < done < len(data)
        got = bytearray()
        os.close(w)
        w = -1
        drain(r, got)
        assert bytes(got) == data[:done]
    finally:
        if w >= 0:
            os.close(w)
        os.close(r)


def test_a_bad_descriptor_raises_oserror() -> None:
    assert linescan.write_pieces is not None
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError) as raised:
        linescan.write_pieces(w, b"x" * 100, 32)
    assert raised.value.errno == errno.EBADF


def test_a_reader_gone_raises_broken_pipe() -> None:
    assert linescan.write_pieces is not None
    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(BrokenPipeError):
            linescan.write_pieces(w, b"x" * 100, 32)
    finally:
        os.close(w)


def test_a_piece_under_one_byte_is_refused() -> None:
    assert linescan.write_pieces is not None
    with pytest.raises(ValueError, match="piece"):
        linescan.write_pieces(1, b"x", 0)
