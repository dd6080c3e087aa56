"""Save and Load URIs are allow-listed at the shard's gRPC boundary
(``streamtrain_ps.service.storage_policy``): outside the job's roots, a query string, a chained or
http URL, a ``..`` segment are refused with INVALID_ARGUMENT naming the URI, before any
storage is touched (a loopback HTTP server standing in for a metadata service sees nothing)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import InvalidRequestError
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.service.storage_policy import check_uri
from streamtrain_ps.shard import Shard

from .conftest import small_config

SCHEMES = ("file", "s3")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/ckpt/20260101?x=",
        "s3://bucket/ckpt#frag",
        "simplecache::s3://bucket/ckpt/x",
        "http://169.254.169.254/latest/meta-data/",
        "s3://bucket/ckpt/../other",
        "s3://bucket/ckpt-other/x",
        "s3://bucket/other/x",
        "/etc/passwd",
        "",
    ],
)
def test_refused_uris_name_the_uri(uri: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        check_uri(uri, ["s3://bucket/ckpt/", "s3://bucket/export"], SCHEMES)
    assert err.value.field == "uri"
    if uri:
        assert repr(uri) in str(err.value)


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/ckpt", "s3://bucket/ckpt/20260101/pass-1-g1", "s3://bucket/export/d/base/"],
)
def test_uris_under_a_root_are_admitted(uri: str) -> None:
    assert check_uri(uri, ["s3://bucket/ckpt/", "s3://bucket/export"], SCHEMES) == uri


def test_without_roots_only_the_scheme_and_shape_are_checked(tmp_path: Path) -> None:
    assert check_uri(str(tmp_path / "x"), [], SCHEMES) == str(tmp_path / "x")
    assert check_uri((tmp_path / "x").as_uri(), [str(tmp_path)], SCHEMES)
    with pytest.raises(InvalidRequestError, match="scheme 'https'"):
        check_uri("https://example.com/x", [], SCHEMES)


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[str]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_a_shard_refuses_load_outside_its_roots_and_query_urls(
    tmp_path: Path, metadata_server: str
) -> None:
    ckpt, export = tmp_path / "ckpt", tmp_path / "export"
    config = replace(small_config(), storageRoots=(str(ckpt), str(export)))
    shard = Shard(config)
    server = PSServer(shard, config)
    server.start()
    client = RemotePS([server.address], config, retry=RetryPolicy(max_attempts=1))
    try:
        client.pull_sparse("embedding", np.arange(1, 4, dtype=np.uint64))
        assert client.save(str(ckpt / "d1"), SaveMode.CHECKPOINT).files  # inside: fine
        refused = [
            str(tmp_path / "elsewhere"),
            f"{ckpt}/d1?x=",
            f"{metadata_server}/latest/meta-data/iam?x=",
            f"simplecache::{metadata_server}/latest",
        ]
        for uri in refused:
            with pytest.raises(InvalidRequestError) as err:
                client.load(uri)
            assert err.value.field == "uri" and repr(uri) in str(err.value)
        with pytest.raises(InvalidRequestError, match="outside the job's storage roots"):
            client.save(str(tmp_path / "elsewhere"), SaveMode.CHECKPOINT)
        assert not (tmp_path / "elsewhere").exists()
        assert _Recorder.hits == []
        assert client.load(str(ckpt / "d1")) >= 0
    finally:
        client.close()
        server.close(grace=0)
        shard.close()
