"""A checkpoint's bytes go to disk with O_DIRECT where the filesystem takes it
(trainer_svc/backends/dtensor/checkpoint.py `write_chunks`): through one aligned buffer, the last
block padded and the file cut back, so the file holds exactly the items' bytes back to back, as a
buffered write leaves it; a filesystem that refuses O_DIRECT gets the buffered write, and any other
error is the save's."""

from __future__ import annotations

import errno

import pytest
import torch

from trainer_svc.backends.dtensor import checkpoint
from trainer_svc.backends.dtensor.checkpoint import DIRECT_STAGE_BYTES, _Chunk, write_chunks


def _chunks() -> tuple[list[_Chunk], bytes]:
    """Items of awkward lengths: a few bytes, a small tensor, one across two stage buffers, a view."""
    generator = torch.Generator().manual_seed(0)
    big = torch.randint(0, 255, (DIRECT_STAGE_BYTES + 4099,), dtype=torch.uint8, generator=generator)
    matrix = torch.randn(64, 33, generator=generator)
    items: list[torch.Tensor | bytes] = [b"header", torch.arange(3, dtype=torch.float32), big, matrix[5:9],
                                         b"\x00tail\xff"]
    chunks, offset, expected = [], 0, b""
    for item in items:
        raw = item if isinstance(item, bytes) else item.contiguous().numpy().tobytes()
        chunks.append(_Chunk(offset, item if isinstance(item, bytes) else item.contiguous()))
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

    monkeypatch.setattr(checkpoint, "_write_direct", refused)
    chunks, expected = _chunks()
    assert write_chunks(tmp_path / "buffered.distcp", chunks) == "buffered"
    assert (tmp_path / "buffered.distcp").read_bytes() == expected


def test_other_write_errors_are_the_saves(tmp_path, monkeypatch):
    def full(file, chunks):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_direct", full)
    with pytest.raises(OSError, match="No space left"):
        write_chunks(tmp_path / "full.distcp", _chunks()[0])
    with pytest.raises(ValueError, match="back to back"):
        write_chunks(tmp_path / "gap.distcp", [_Chunk(0, b"ab"), _Chunk(3, b"cd")])
