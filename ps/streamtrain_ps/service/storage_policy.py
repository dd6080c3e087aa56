"""Which storage URIs a shard's Save and Load may name: the gRPC boundary's allow-list.

A shard writes and reads with the job's storage credentials wherever a URI points, and
fsspec follows any URL it can open: ``http://169.254.169.254/...`` or ``s3://b/k?x=`` reach
addresses nobody meant to expose (a blind SSRF), a chained ``simplecache::http://`` or a
``..`` segment escapes a prefix check. So a URI is admitted only if

- it has no query string, fragment or chain (``?``, ``#``, ``::``) and no ``..`` segment;
- its scheme is one of ``PSConfig.storageSchemes`` (a plain path is ``file``);
- with ``PSConfig.storageRoots`` set (the operator sets the job's checkpoint and export
  roots), it is one of the roots or below one.

Refusals are ``InvalidRequestError("uri", ...)`` (INVALID_ARGUMENT) naming the URI.
Pure: no I/O, so a refused URI never touches storage.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamtrain_ps.errors import InvalidRequestError


def _scheme(uri: str) -> str:
    head, sep, _ = uri.partition("://")
    return head.lower() if sep else "file"


def _normal(uri: str) -> str:
    """Without a ``file://`` prefix and trailing slashes (``/`` stays ``/``)."""
    if uri.lower().startswith("file://"):
        uri = uri[len("file://") :]
    return uri.rstrip("/") or "/"


def check_uri(uri: str, roots: Iterable[str], schemes: Iterable[str]) -> str:
    """``uri`` if a shard may save to or load from it, else ``InvalidRequestError``."""
    if not uri:
        raise InvalidRequestError("uri", "must be a non-empty fsspec URL")
    for mark, what in (("?", "a query string"), ("#", "a fragment"), ("::", "a chained URL")):
        if mark in uri:
            raise InvalidRequestError("uri", f"{uri!r}: {what} is not a storage location")
    if ".." in uri.replace("\\", "/").split("/"):
        raise InvalidRequestError("uri", f"{uri!r}: a '..' segment is not allowed")
    scheme = _scheme(uri)
    allowed = sorted(set(schemes))
    if scheme not in allowed:
        raise InvalidRequestError(
            "uri", f"{uri!r}: scheme {scheme!r} is not allowed (allowed: {', '.join(allowed)})"
        )
    roots = [_normal(r) for r in roots]
    if roots:
        path = _normal(uri)
        if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
            raise InvalidRequestError(
                "uri", f"{uri!r} is outside the job's storage roots ({', '.join(roots)})"
            )
    return uri
