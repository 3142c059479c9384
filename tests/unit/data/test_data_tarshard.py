"""Reading a shard's fields where they lie (`Member`, the loader's undecoded path) gives what tarfile's reading
gives, whatever the tar's headers: plain ustar, names split into ustar's prefix, GNU long names, pax records,
directories and links, sparse files, a garbled header or pax record."""

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.tarshard import Header, Member, Shard, ShardCorrupt
from hpctrain.errors import DataError

from helpers.data import flip_byte


def member(name: str, data: bytes | None, fmt: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One member's header(s) and data, in ``fmt``: a tar may mix them, as archives appended to by other tools do."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, len(data or b""), 1_700_000_000
    if kind == tarfile.SYMTYPE:
        info.linkname = "elsewhere"
    padded = (data or b"") + b"\0" * (-len(data or b"") % tarfile.BLOCKSIZE)
    return info.tobuf(fmt, "utf-8", "surrogateescape") + padded


def shard(tmp_path: Path, members: list[bytes], samples: int) -> tuple[ShardIndex, ShardInfo]:
    path = tmp_path / "shard.tar"
    path.write_bytes(b"".join(members) + b"\0" * (2 * tarfile.BLOCKSIZE))
    return indexed(path, samples)


def indexed(path: Path, samples: int) -> tuple[ShardIndex, ShardInfo]:
    info = ShardInfo(path.name, samples, path.stat().st_size, "-")
    return ShardIndex(path.with_name("index.json"), (info,)), info


def read(index: ShardIndex, info: ShardInfo, located: bool) -> tuple[list, str | None]:
    """Every sample as (number, {field: bytes}), with each located field read; and the error that ended it."""
    got = []
    with Shard(index, info) as opened:
        try:
            for i, sample in opened.samples(range(info.samples), located):
                assert located or not any(isinstance(v, Member) for v in sample.values())
                got.append((i, {k: v.read() if isinstance(v, Member) else v for k, v in sample.items()}))
        except ShardCorrupt as exc:
            return got, str(exc)
    return got, None


LONG = "d" * 90 + "/" + "e" * 60  # 151 characters: ustar splits it into prefix and name


def test_located_fields_are_tarfiles_bytes_across_header_kinds(tmp_path):
    members = [
        member("s0.txt", b"zero", tarfile.USTAR_FORMAT),
        member("s0.cls", b"0", tarfile.GNU_FORMAT),
        member(f"{LONG}/s1.txt", b"one" * 200, tarfile.USTAR_FORMAT),
        member("sé2.txt/", b"two", tarfile.PAX_FORMAT),  # a pax record's path: tarfile strips a file's trailing "/"
        member("s2.cls/", b"2", tarfile.USTAR_FORMAT),  # a plain header's "/" stays: no extension, not a field
        member("dir/", None, tarfile.USTAR_FORMAT, tarfile.DIRTYPE),  # tarfile reads on from here
        member("s" * 120 + "3.txt", b"three", tarfile.GNU_FORMAT),  # a GNU long-name header first
        member("s4.jpg", b"\xff\xd8" * 700, tarfile.USTAR_FORMAT),
        member("s4.link", None, tarfile.USTAR_FORMAT, tarfile.SYMTYPE),
        member("sé5.txt", b"five", tarfile.PAX_FORMAT),
        member("s6.txt", b"", tarfile.USTAR_FORMAT),
    ]
    index, info = shard(tmp_path, members, 7)
    with Shard(index, info) as opened:
        assert all(isinstance(v, Member) for _, sample in opened.samples(range(7), located=True)
                   for k, v in sample.items() if k != "__key__")
    located, error = read(index, info, located=True)
    assert error is None and located == read(index, info, located=False)[0]
    assert [sorted(s) for _, s in located][:3] == [["__key__", "cls", "txt"], ["__key__", "txt"], ["__key__", "txt"]]
    assert located[1][1] == {"__key__": f"{LONG}/s1", "txt": b"one" * 200}
    assert [s["__key__"] for _, s in located[2:]] == ["sé2", "s" * 120 + "3", "s4", "sé5", "s6"]


def test_a_sparse_member_is_read_expanded(tmp_path):
    (tmp_path / "s0.bin").write_bytes(b"")
    os.truncate(tmp_path / "s0.bin", 1 << 20)
    with open(tmp_path / "s0.bin", "r+b") as fh:
        fh.seek(700_000)
        fh.write(b"data in a hole")
    (tmp_path / "s1.txt").write_bytes(b"after")
    subprocess.run(["tar", "--format=gnu", "--sparse", "-cf", "shard.tar", "s0.bin", "s1.txt"], cwd=tmp_path,
                   check=True)
    index, info = indexed(tmp_path / "shard.tar", 2)
    with Shard(index, info) as opened:
        fields = [sample for _, sample in opened.samples(range(2), located=True)]
        assert isinstance(fields[0]["bin"], bytes) and isinstance(fields[1]["txt"], Member)  # tarfile expands it
    located, error = read(index, info, located=True)
    assert error is None and located == read(index, info, located=False)[0]
    assert located[0][1]["bin"] == (tmp_path / "s0.bin").read_bytes() and located[1][1]["txt"] == b"after"
    assert index.shards[0].bytes < 100_000  # stored compacted


def test_webdatasets_shards_are_read_without_tarfile(tmp_path):
    import webdataset

    path = tmp_path / "shard.tar"
    with webdataset.TarWriter(str(path)) as writer:
        for i in range(3):
            writer.write({"__key__": f"s{i}", "txt": "x" * (300 * i), "cls": i})
    index, info = indexed(path, 3)
    with Shard(index, info) as opened:
        assert [type(h) for h in opened.headers()] == [Header] * 6  # every member behind a pax record of its own
    located, error = read(index, info, located=True)
    assert error is None and located == read(index, info, located=False)[0]
    assert located[2][1] == {"__key__": "s2", "txt": b"x" * 600, "cls": b"2"}


def with_checksum(header: bytearray) -> bytes:
    header[148:156] = b"%06o\0 " % (256 + sum(header[:148]) + sum(header[156:512]))
    return bytes(header)


def pax_record(records: bytes) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    return info.tobuf(tarfile.USTAR_FORMAT) + records + b"\0" * (-len(records) % tarfile.BLOCKSIZE)


def bad_mtime(header: bytes) -> bytes:
    garbled = bytearray(header)
    garbled[136:148] = b"zzzzzzzzzzz\0"
    return with_checksum(garbled) + header[512:]


@pytest.mark.parametrize("damage, read_on", [("checksum", False), ("mtime", False), ("pax length 0", False),
                                              ("pax length negative", True)])  # tarfile: a record of none
def test_a_garbled_header_ends_the_shard_where_tarfile_ends_it(damage, read_on, tmp_path):
    members = [member(f"s{i}.bin", bytes([i]) * 1000, tarfile.USTAR_FORMAT) for i in range(5)]
    if damage == "mtime":  # the checksum is right, a number is not
        members[3] = bad_mtime(members[3])
    elif damage.startswith("pax"):
        members.insert(3, pax_record(b"0 path=x\n" if damage.endswith("0") else b"-9 path=x\n"))
    index, info = shard(tmp_path, members, 5)
    if damage == "checksum":
        flip_byte(index.shard_path(info), 3 * 1536 + 100)  # the fourth header: 512 bytes + 1000 of data, padded
    located = read(index, info, located=True)
    assert located == read(index, info, located=False)
    if read_on:
        assert [i for i, _ in located[0]] == [0, 1, 2, 3, 4] and located[1] is None
    else:
        assert [i for i, _ in located[0]] == [0, 1, 2] and located[1] == "3 samples, index says 5"


def test_a_member_past_the_end_is_corrupt_and_bytes_gone_since_are_a_data_error(tmp_path):
    index, info = shard(tmp_path, [member(f"s{i}.bin", bytes(700), tarfile.USTAR_FORMAT) for i in range(3)], 3)
    with Shard(index, info) as opened:
        fields = [s["bin"] for _, s in opened.samples(range(3), located=True)]
        os.truncate(index.shard_path(info), fields[2].offset + 100)  # the shard changed while being read
        assert fields[0].read() == bytes(700)
        with pytest.raises(DataError, match=r"shard.tar: 100 of 700 bytes at byte 3584: the shard changed"):
            fields[2].read_into(memoryview(bytearray(700)))
    claims_more = bytearray(member("s0.bin", bytes(700), tarfile.USTAR_FORMAT))
    claims_more[124:136] = b"%011o\0" % 10_000  # its size field says more than the shard holds
    index, info = shard(tmp_path, [with_checksum(claims_more)], 1)
    with Shard(index, info) as opened, pytest.raises(ShardCorrupt, match="'s0.bin' ends at byte 10512, past"):
        list(opened.samples([0], located=True))
