"""Shards behind URLs: `pipe:` commands and http(s) served by a local server, indexed, read, resumed, and failing."""

import contextlib
import json
import logging
import re
import socket
import tarfile
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from webdataset.writer import numpy_dumps

from hpctrain.cli.data import data
from hpctrain.data import ShardIndex, ShardLoader, index_shards, load_index, pack
from hpctrain.data.source import RANGE_GAP
from hpctrain.errors import DataError

from helpers.data import KW, flip_byte, make_dataset, take, take_across_epochs


class Server:
    """A threaded HTTP server for a directory that answers ``Range: bytes=N-`` with 206 as web servers and object
    stores do (http.server's own handler ignores ranges), or, with ``ranges=False``, the whole file with 200.
    ``requests`` logs each request's path and the first byte it asked for."""

    def __init__(self, root: Path, ranges: bool = True):
        self.requests: list[tuple[str, int | None]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(root, ranges))
        self.url = f"http://127.0.0.1:{self._httpd.server_port}"
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self, root: Path, ranges: bool) -> type[BaseHTTPRequestHandler]:
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                requests.append((self.path, int(asked[1]) if asked else None))
                path = root / self.path.lstrip("/")
                if not path.is_file():
                    return self.send_error(404)
                content = path.read_bytes()
                start = int(asked[1]) if asked and ranges else 0
                if start >= len(content) > 0:
                    return self.send_error(416)
                self.send_response(206 if asked and ranges else 200)
                self.send_header("Content-Length", str(len(content) - start))
                if asked and ranges:
                    self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading
                    self.wfile.write(content[start:])

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@contextlib.contextmanager
def serving(root: Path, ranges: bool = True):
    server = Server(root, ranges)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def index(tmp_path):
    return make_dataset(tmp_path / "ds", 100, per_shard=9)  # 12 shards: 11 x 9 + 1


@pytest.fixture
def server(index):
    with serving(index.root) as running:
        yield running


def locations(scheme: str, index: ShardIndex, server: Server) -> list[str]:
    return [f"{server.url}/{s.name}" if scheme == "http" else f"pipe:cat {index.shard_path(s)}" for s in index.shards]


@pytest.fixture(params=["http", "pipe"])
def remote(request, index, server, tmp_path):
    """The same shards as ``index``, indexed behind URLs."""
    return index_shards(tmp_path / request.param / "index.json", locations(request.param, index, server))


@pytest.mark.parametrize("scheme", ["http", "pipe"])
def test_index_command_reads_each_url_shard_once_and_describes_the_same_shards(scheme, index, server, tmp_path):
    out = tmp_path / scheme / "index.json"
    result = CliRunner().invoke(data, ["index", str(out), *locations(scheme, index, server)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("indexed 100 samples in 12 shards")
    got = load_index(out)
    assert [s.content() for s in got.shards] == [s.content() for s in index.shards] and got.digest == index.digest
    assert [s.url for s in got.shards] == locations(scheme, index, server)
    if scheme == "http":
        assert sorted(server.requests) == [(f"/{s.name}", 0) for s in index.shards]


def test_index_command_takes_local_files_next_to_the_index_and_refuses_others(index, tmp_path):
    assert index_shards(index.path, [str(index.shard_path(s)) for s in index.shards]).shards == index.shards
    with pytest.raises(DataError, match="must be in the index's directory"):
        index_shards(tmp_path / "elsewhere.json", [str(index.shard_path(index.shards[0]))])


@pytest.mark.parametrize("urls, message", [
    (["pipe:cat a.tar", "http://host/b/a.tar"], "http://host/b/a.tar: the same file name as pipe:cat a.tar"),
    (["pipe:make-shard 3"], "pipe:make-shard 3: no file name"),
])
def test_shards_need_distinct_file_names(urls, message, tmp_path):
    with pytest.raises(DataError, match=re.escape(message)):
        index_shards(tmp_path / "index.json", urls)


def test_an_epoch_over_urls_is_the_local_epoch(remote, index, caplog):
    caplog.set_level(logging.INFO, logger="hpctrain.data")
    assert take(ShardLoader(remote.path, **KW), None) == take(ShardLoader(index.path, **KW), None)
    pipe_notes = [r.getMessage() for r in caplog.records if "cannot seek" in r.getMessage()]
    assert pipe_notes == ([f"{remote.path}: 12 of 12 shards are pipe: commands, which cannot seek: reading one from "
                           "sample k (on resume, or where the epoch's plan splits it between readers) reads and "
                           "discards the bytes before k"] if remote.shards[0].url.startswith("pipe:") else [])


def test_resume_over_urls_continues_sample_for_sample(remote, index):
    reference = take_across_epochs(ShardLoader(index.path, **KW), 50)  # two epochs, read locally
    for k in (1, 2, 7, 25, 31):  # mid-shard, odd (the other worker is next), end of epoch, next epoch
        loader = ShardLoader(remote.path, **KW)
        assert take_across_epochs(loader, k) == reference[: 4 * k]
        fresh = ShardLoader(remote.path, **KW)
        fresh.load_state_dict(json.loads(json.dumps(loader.state_dict())))
        assert take_across_epochs(fresh, 50 - k) == reference[4 * k:]


def test_a_local_state_resumes_over_urls_holding_the_same_shards(remote, index):
    reference = take(ShardLoader(index.path, **KW), None)
    local = ShardLoader(index.path, **KW)
    head = take(local, 7)
    moved = ShardLoader(remote.path, **KW)
    moved.load_state_dict(local.state_dict())
    assert head + take(moved, None) == reference


BIG = 200_000  # int64 values: a sample of 1.6 MB, more than RANGE_GAP


@pytest.mark.parametrize("ranges", [True, False])
def test_http_resume_skips_to_the_sample_with_a_range_request(ranges, tmp_path):
    size = len(numpy_dumps(np.zeros(BIG, dtype=np.int64)))
    assert size > RANGE_GAP + (64 << 10)  # more than the gap plus what the reader buffers after a header
    big = pack(({"__key__": f"s{i:05d}", "npy": np.full(BIG, i, dtype=np.int64)} for i in range(6)),
               tmp_path / "big", shard_bytes=3 * size - 1)
    assert [s.samples for s in big.shards] == [3, 3]
    kw = dict(batch_size=1, workers=0, shuffle_buffer=0)
    with serving(big.root, ranges) as server:
        web = index_shards(tmp_path / "web" / "index.json", [f"{server.url}/{s.name}" for s in big.shards])
        reference = take(ShardLoader(web.path, **kw), None)
        loader = ShardLoader(web.path, **kw)
        head = take(loader, 1)
        state = loader.state_dict()
        server.requests.clear()
        fresh = ShardLoader(web.path, **kw)
        fresh.load_state_dict(state)
        assert head + take(fresh, None) == reference
    resumed = state["positions"][0]["shard"]
    asked = [start for path, start in server.requests if path == f"/{resumed}"]
    with tarfile.open(big.root / resumed) as tar:
        second = tar.getmembers()[1].offset  # the header of the sample resumed at
    if ranges:  # the first header, then straight to the second sample's (tarfile seeks to the byte before it)
        assert asked[0] == 0 and asked[1] in (second - 1, second) and len(asked) == 2
    else:  # a server that ignores ranges answers the first request with the whole shard, read through
        assert asked == [0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("broken, message", [
    (lambda ds, url: dict(url=f"{url}/gone.tar"), "{url}/gone.tar: HTTP 404 Not Found"),
    (lambda ds, url: dict(url=f"http://127.0.0.1:{closed_port()}/x.tar"), r"http://127.0.0.1:\d+/x.tar: .*refused"),
    (lambda ds, url: dict(url=f"pipe:cat {ds}/gone.tar"),
     "pipe:cat {ds}/gone.tar: exit status 1: cat: {ds}/gone.tar: No such file or directory"),
    (lambda ds, url: dict(url=f"pipe:head -c 5000 {ds}/shard-000003.tar; exit 3"),
     "pipe:head -c 5000 {ds}/shard-000003.tar; exit 3: exit status 3"),
    (lambda ds, url: dict(name="gone.tar"), "{ds}/gone.tar: No such file or directory"),
], ids=["http-404", "http-refused", "pipe-fails", "pipe-fails-midway", "local-missing"])
def test_a_shard_that_cannot_be_read_stops_the_loader_with_one_line_naming_it(broken, message, index, server, tmp_path):
    shards = list(index.shards)
    shards[3] = replace(shards[3], **broken(index.root, server.url))
    bad = ShardIndex(index.root / "broken.json", tuple(shards))
    bad.write()
    expected = message.format(ds=index.root, url=server.url)
    with pytest.raises(DataError) as raised:
        take(ShardLoader(bad.path, **KW), None)
    assert re.fullmatch(expected if "refused" in message else re.escape(expected), str(raised.value))
    assert not bad.quarantine_dir.exists()  # unreachable says nothing about the data: not quarantined
    if shards[3].url:
        with pytest.raises(DataError, match=re.escape(shards[3].url)):
            index_shards(tmp_path / "index.json", [shards[3].url])


def test_verify_reads_url_shards_and_names_a_bad_one_by_its_url(remote, index):
    ok = CliRunner().invoke(data, ["verify", str(remote.path)])
    assert ok.exit_code == 0 and ok.output.strip() == "12 of 12 shards ok"
    flip_byte(index.shard_path(index.shards[2]), 600)
    bad = CliRunner().invoke(data, ["verify", str(remote.path)])
    assert bad.exit_code == 1 and bad.output.splitlines()[0].startswith(f"{remote.shards[2].url}: sha256 ")
