"""A card or records sidecar far larger than any real one is refused before it is read into
memory (att27b): a sparse 3 GiB card gave a MemoryError traceback (or filled the machine's
memory), a sidecar likewise under `report`."""
import errno
import os

import pytest

from stateremat._shared.io import read_regular_bytes
from stateremat.contract import ProfileCardError, load_card

MAX_READ_BYTES = 256 * 2**20  # stateremat._shared.io.MAX_READ_BYTES


def test_read_regular_bytes_refuses_a_file_over_its_limit(tmp_path):
    f = tmp_path / "c.json"
    f.write_bytes(b"x" * 11)
    assert read_regular_bytes(f, limit=11) == b"x" * 11
    with pytest.raises(OSError) as info:
        read_regular_bytes(f, limit=10)
    assert info.value.errno == errno.EFBIG and "over 10 bytes" in info.value.strerror


def test_load_card_refuses_a_huge_sparse_card_by_its_size(tmp_path):
    f = tmp_path / "huge.json"
    with open(f, "wb") as fh:
        fh.truncate(MAX_READ_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(ProfileCardError) as info:
        load_card(f)
    assert f"over {MAX_READ_BYTES:,} bytes" in str(info.value) and str(f) in str(info.value)


def test_a_symlink_to_a_card_still_reads(tmp_path):
    real = tmp_path / "real.json"
    real.write_bytes(b'{"a": 1}')
    link = tmp_path / "link.json"
    os.symlink(real, link)
    assert read_regular_bytes(link) == b'{"a": 1}'


def test_the_limit_is_the_documented_one():
    from stateremat._shared import io

    assert io.MAX_READ_BYTES == MAX_READ_BYTES
