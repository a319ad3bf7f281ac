"""A checkpoint's bytes go to disk and come back with O_DIRECT where the filesystem takes it
(trainer_svc/backends/dtensor/direct_io.py `write_chunks`, `read_ranges`): written through one
aligned buffer, the last block padded and the file cut back, so the file holds exactly the items'
bytes back to back, as a buffered write leaves it; read in aligned windows into one buffer and
copied to each place, whatever its offset and length. A filesystem that refuses O_DIRECT gets
buffered I/O, and any other error is the save's or the load's."""

from __future__ import annotations

import errno

import pytest
import torch

from trainer_svc.backends.dtensor import direct_io
from trainer_svc.backends.dtensor.direct_io import DIRECT_STAGE_BYTES, Chunk, read_ranges, write_chunks


def _chunks() -> tuple[list[Chunk], bytes]:
    """Items of awkward lengths: a few bytes, a small tensor, one across two stage buffers, a view."""
    generator = torch.Generator().manual_seed(0)
    big = torch.randint(0, 255, (DIRECT_STAGE_BYTES + 4099,), dtype=torch.uint8, generator=generator)
    matrix = torch.randn(64, 33, generator=generator)
    items: list[torch.Tensor | bytes] = [b"header", torch.arange(3, dtype=torch.float32), big, matrix[5:9],
                                         b"\x00tail\xff"]
    chunks, offset, expected = [], 0, b""
    for item in items:
        raw = item if isinstance(item, bytes) else item.contiguous().numpy().tobytes()
        chunks.append(Chunk(offset, item if isinstance(item, bytes) else item.contiguous()))
        offset += len(raw)
        expected += raw
    return chunks, expected


def test_a_direct_write_leaves_exactly_the_items_bytes(tmp_path):
    chunks, expected = _chunks()
    assert write_chunks(tmp_path / "direct.distcp", chunks) == "direct"  # the tests' disk takes O_DIRECT
    assert (tmp_path / "direct.distcp").read_bytes() == expected
    assert len(expected) % 4096 and len(expected) > DIRECT_STAGE_BYTES  # a padded last block, cut back


def test_a_filesystem_that_refuses_o_direct_gets_the_buffered_write(tmp_path, monkeypatch):
    def refused(file, chunks):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(direct_io, "_write_direct", refused)
    chunks, expected = _chunks()
    assert write_chunks(tmp_path / "buffered.distcp", chunks) == "buffered"
    assert (tmp_path / "buffered.distcp").read_bytes() == expected


def test_other_write_errors_are_the_saves(tmp_path, monkeypatch):
    def full(file, chunks):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io, "_write_direct", full)
    with pytest.raises(OSError, match="No space left"):
        write_chunks(tmp_path / "full.distcp", _chunks()[0])
    with pytest.raises(ValueError, match="back to back"):
        write_chunks(tmp_path / "gap.distcp", [Chunk(0, b"ab"), Chunk(3, b"cd")])


def _places(expected: bytes) -> list[tuple[int, bytearray]]:
    """Ranges of the file to read back: unaligned, one spanning two stage windows, one read twice
    (a weight tied to two targets), one ending at the file's last byte."""
    ranges = [(0, 6), (6, 12), (18, DIRECT_STAGE_BYTES + 4099), (18 + 4096, 100), (len(expected) - 7, 7)]
    return [(offset, bytearray(length)) for offset, length in sorted(ranges)]


@pytest.mark.parametrize("direct", [True, False])
def test_reads_fill_each_place_with_the_files_bytes(tmp_path, direct):
    chunks, expected = _chunks()
    write_chunks(tmp_path / "ckpt.distcp", chunks)
    places = _places(expected)
    how = read_ranges(tmp_path / "ckpt.distcp", ((offset, memoryview(into)) for offset, into in places), direct=direct)
    assert how == ("direct" if direct else "buffered")
    for offset, into in places:
        assert bytes(into) == expected[offset:offset + len(into)], offset


def test_each_place_is_filled_before_the_next_is_asked_for(tmp_path):
    chunks, expected = _chunks()
    write_chunks(tmp_path / "ckpt.distcp", chunks)
    seen = []

    def places():
        for offset, into in _places(expected):
            yield offset, memoryview(into)
            seen.append(bytes(into) == expected[offset:offset + len(into)])  # a resharding load copies it out now

    read_ranges(tmp_path / "ckpt.distcp", places())
    assert seen == [True] * 5


@pytest.mark.parametrize("direct", [True, False])
def test_a_file_cut_short_is_a_partial_write(tmp_path, direct):
    chunks, expected = _chunks()
    write_chunks(tmp_path / "ckpt.distcp", chunks)
    with open(tmp_path / "ckpt.distcp", "r+b") as f:
        f.truncate(len(expected) - 5)
    with pytest.raises(ValueError, match="partial write"):
        read_ranges(tmp_path / "ckpt.distcp", iter([(len(expected) - 10, memoryview(bytearray(10)))]), direct=direct)


def test_a_filesystem_that_refuses_o_direct_reads_buffered(tmp_path, monkeypatch):
    chunks, expected = _chunks()
    write_chunks(tmp_path / "ckpt.distcp", chunks)
    real_open = direct_io.os.open

    def refusing(path, flags, *args):
        if flags & direct_io.os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", refusing)
    into = bytearray(100)
    assert read_ranges(tmp_path / "ckpt.distcp", [(3, memoryview(into))]) == "buffered"
    assert bytes(into) == expected[3:103]
