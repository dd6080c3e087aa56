"""Mutual TLS on the data path: PS shards, workers and the scheduler, and who may call what.

On by default in a cluster (the chart's ``tls.mode``: the operator mounts each job's
certificate into its pods); local mode keeps plaintext on loopback. The per-job
NetworkPolicy limits who reaches a port; the certificates say who is calling.

One set of three PEM files serves both sides:

- the server presents ``cert``/``key``; with ``ca`` it also *requires* client certificates
  signed by that CA (mutual TLS), so only holders of a job certificate can pull or push;
- the client verifies the server against ``ca`` and presents ``cert``/``key`` as its own
  certificate (omit them for server-only TLS).

The server certificate's subject alternative names must cover the address clients dial
(the pod DNS names ``<job>-ps-<i>.<job>-ps.<ns>.svc``, or ``127.0.0.1`` locally);
``server_name`` overrides the name checked, for certificates issued to one shared name.
Files are read once, when credentials are built; rotating them means restarting the pods.

Authorisation (``PeerPolicy``, enforced by ``authorising_interceptor``): a peer's identities
are its certificate's common name and DNS subject alternative names. Control methods (save,
load, shrink; run-pass, export, reset) admit only ``control`` identities (the operator's),
data methods also ``data`` ones (the job's own pods). ``grpc.health.v1`` stays open: it tells
nothing and kubelet probes carry no certificate.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

HEALTH_SERVICE = "grpc.health.v1.Health"


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


@dataclass(frozen=True)
class PeerPolicy:
    """Which certificate identities may call a server's control and data methods."""

    #: Identities allowed everything (the operator's).
    control: frozenset[str]
    #: Identities allowed the data methods only (the job's pods).
    data: frozenset[str]
    #: Method names (``Save``, ``RunPass``) that need a ``control`` identity.
    control_methods: frozenset[str]

    @classmethod
    def of(
        cls, control: Iterable[str], data: Iterable[str], control_methods: Iterable[str]
    ) -> PeerPolicy:
        return cls(frozenset(control), frozenset(data), frozenset(control_methods))

    def allows(self, method: str, identities: frozenset[str]) -> bool:
        allowed = self.control if method in self.control_methods else self.control | self.data
        return bool(identities & allowed)


def peer_identities(context: grpc.ServicerContext) -> frozenset[str]:
    """The calling certificate's common name and DNS SANs (empty without a certificate)."""
    auth = context.auth_context()
    names = [*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())]
    return frozenset(n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names)


def describe_peer(context: grpc.ServicerContext) -> str:
    """``address`` plus, over mutual TLS, the certificate's identities: for audit lines."""
    ids = peer_identities(context)
    return f"{context.peer()} ({', '.join(sorted(ids))})" if ids else context.peer()


class _Authorising(grpc.ServerInterceptor):
    def __init__(self, policy: PeerPolicy) -> None:
        self._policy = policy

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        service, _, method = details.method.lstrip("/").rpartition("/")
        if handler is None or service == HEALTH_SERVICE or handler.unary_unary is None:
            return handler
        inner, policy = handler.unary_unary, self._policy

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            ids = peer_identities(context)
            if not policy.allows(method, ids):
                who = ", ".join(sorted(ids)) or "no certificate"
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{method}: peer {context.peer()} ({who}) is not authorised to call it",
                )
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def authorising_interceptor(policy: PeerPolicy) -> grpc.ServerInterceptor:
    """Refuse (PERMISSION_DENIED) a method the calling certificate is not allowed."""
    return _Authorising(policy)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The TLS flags both server processes (PS shard, worker) take."""
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", type=Path, help="PEM CA: require client certificates it signed")
    p.add_argument(
        "--tls-control-peer",
        action="append",
        default=[],
        help="certificate identity (CN or DNS SAN) allowed the control methods (repeatable)",
    )
    p.add_argument(
        "--tls-data-peer",
        action="append",
        default=[],
        help="certificate identity allowed the data methods only (repeatable)",
    )
    p.add_argument(
        "--health-port", type=int, help="with TLS: serve gRPC health in plaintext on this port"
    )


def from_args(args: argparse.Namespace) -> TLSFiles | None:
    """The ``TLSFiles`` of the flags (``None``: plaintext), files read and checked now.
    Raises ``TLSConfigError`` naming the flag."""
    if (args.tls_control_peer or args.tls_data_peer) and not args.tls_ca:
        raise TLSConfigError("--tls-control-peer/--tls-data-peer need --tls-ca")
    if not (args.tls_cert or args.tls_key or args.tls_ca):
        return None
    tls = TLSFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    tls.server_credentials()  # read and check the files before anything is built
    return tls


def policy_from_args(args: argparse.Namespace, control_methods: Iterable[str]) -> PeerPolicy | None:
    """Who may call the server (``None``: any peer the CA signed)."""
    if not args.tls_control_peer and not args.tls_data_peer:
        return None
    return PeerPolicy.of(args.tls_control_peer, args.tls_data_peer, control_methods)
