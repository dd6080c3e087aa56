"""Optional TLS between PS clients (workers, scheduler) and PS shards.

Off by default: inside a cluster the per-job NetworkPolicy already limits who reaches the PS
port, and TLS costs CPU on every pull and push. Turn it on when the pod network is shared
with untrusted workloads or crosses hosts without encryption.

One set of three PEM files serves both sides:

- the server presents ``cert``/``key``; with ``ca`` it also *requires* client certificates
  signed by that CA (mutual TLS), so only holders of a job certificate can pull or push;
- the client verifies the server against ``ca`` and presents ``cert``/``key`` as its own
  certificate (omit them for server-only TLS).

The server certificate's subject alternative names must cover the address clients dial
(the pod DNS names ``<job>-ps-<i>.<job>-ps.<ns>.svc``, or ``127.0.0.1`` locally);
``server_name`` overrides the name checked, for certificates issued to one shared name.
Files are read once, when credentials are built; rotating them means restarting the pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


class TLSConfigError(ValueError):
    """A TLS file is missing or unreadable; the message names the flag and the path."""


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"{what} {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN" not in data:
        raise TLSConfigError(f"{what} {path}: not a PEM file")
    return data


@dataclass(frozen=True)
class TLSFiles:
    """PEM paths: this side's certificate chain and key, and the CA that signs the peer."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    #: Name to verify in the server certificate instead of the dialled host (client side).
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TLSConfigError("--tls-cert and --tls-key go together")

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present cert/key; with a CA, require client certificates (mTLS)."""
        cert = _read(self.cert, "--tls-cert")
        key = _read(self.key, "--tls-key")
        if cert is None or key is None:
            raise TLSConfigError("a TLS server needs --tls-cert and --tls-key")
        ca = _read(self.ca, "--tls-ca")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: verify the server against the CA (system roots without one) and
        present cert/key if given."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "--tls-ca"),
            private_key=_read(self.key, "--tls-key"),
            certificate_chain=_read(self.cert, "--tls-cert"),
        )

    def channel_options(self) -> list[tuple[str, str]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]
