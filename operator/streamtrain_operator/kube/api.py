"""The only module that calls the Kubernetes API (everything else builds plain dicts).

A deliberately small surface over the official ``kubernetes`` client: apply (create, and on
409 merge-patch the same object), delete (404 is fine), scale a StatefulSet, patch the job's
status, post an Event, read pod identities and restart counts, and read, create and
conditionally replace the job's driver Lease (``lease.py``). Every call carries the
request timeout from the operator's settings, so a half-dead connection cannot stall a
handler forever.

The calls are synchronous: kopf runs sync handlers in its thread pool, and the daemon's
status saves are single small requests. :class:`KubeAPI` is the protocol handlers depend
on; tests pass a fake that records calls.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from streamtrain_operator.job.spec import API_VERSION, KIND
from streamtrain_operator.kube.lease import LeaseConflict

log = logging.getLogger(__name__)

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "streamingtrainingjobs"
MERGE_PATCH = "application/merge-patch+json"
#: kind -> (client API class, method suffix) for the kinds the operator manages.
_KINDS: dict[str, tuple[type, str]] = {
    "ConfigMap": (client.CoreV1Api, "config_map"),
    "Service": (client.CoreV1Api, "service"),
    "StatefulSet": (client.AppsV1Api, "stateful_set"),
    "NetworkPolicy": (client.NetworkingV1Api, "network_policy"),
}


class _Certificates:
    """cert-manager ``Certificate``s through the custom-objects API, under the method names
    ``Kube`` calls for the built-in kinds."""

    GROUP, VERSION, PLURAL = "cert-manager.io", "v1", "certificates"

    def __init__(self, api: client.ApiClient) -> None:
        self._api = client.CustomObjectsApi(api)

    def create_namespaced_certificate(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self._api.create_namespaced_custom_object(
            self.GROUP, self.VERSION, namespace, self.PLURAL, body, **kw
        )

    def patch_namespaced_certificate(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self._api.patch_namespaced_custom_object(
            self.GROUP, self.VERSION, namespace, self.PLURAL, name, body, **kw
        )

    def delete_namespaced_certificate(self, name: str, namespace: str, **kw: Any) -> Any:
        return self._api.delete_namespaced_custom_object(
            self.GROUP, self.VERSION, namespace, self.PLURAL, name, **kw
        )


_KINDS["Certificate"] = (_Certificates, "certificate")


class KubeAPI(Protocol):
    """What the handlers and the daemon need from the cluster."""

    def apply(self, obj: Mapping[str, Any]) -> str:
        """Create or update ``obj``; returns ``"created"`` or ``"patched"``."""
        ...

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one object; ``False`` if it was already gone."""
        ...

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        """Set a StatefulSet's replica count."""
        ...

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the job's status subresource."""
        ...

    def event(self, job: Mapping[str, str], type_: str, reason: str, message: str) -> None:
        """Post an Event about the job (``job``: namespace, name, uid)."""
        ...

    def pods(self, namespace: str, selector: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """``name -> (uid, container restarts)`` of the pods matching ``selector``: a new
        uid (pod recreated) or a higher count (container restarted) both mean the process
        lost its memory."""
        ...

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as a dict (``None`` if absent)."""
        ...

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Lease; ``LeaseConflict`` if it exists."""
        ...

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Overwrite a Lease's spec (a merge-patch); ``LeaseConflict`` unless ``body``'s
        ``resourceVersion`` is the current one."""
        ...


class Kube:
    """:class:`KubeAPI` over a ``kubernetes.client.ApiClient``."""

    def __init__(self, api: client.ApiClient, request_timeout: float = 60.0) -> None:
        self.api = api
        self.timeout = request_timeout

    def _api(self, kind: str) -> tuple[Any, str]:
        try:
            cls, suffix = _KINDS[kind]
        except KeyError:
            raise ValueError(f"kube: {kind} is not a kind the operator manages") from None
        return cls(self.api), suffix

    def apply(self, obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        api, suffix = self._api(obj["kind"])
        try:
            getattr(api, f"create_namespaced_{suffix}")(
                meta["namespace"], dict(obj), _request_timeout=self.timeout
            )
            return "created"
        except ApiException as exc:
            if exc.status != 409:
                raise
        # It exists (a previous run, another handler): converge it to what we built.
        getattr(api, f"patch_namespaced_{suffix}")(
            meta["name"],
            meta["namespace"],
            dict(obj),
            _content_type=MERGE_PATCH,
            _request_timeout=self.timeout,
        )
        return "patched"

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        api, suffix = self._api(kind)
        try:
            getattr(api, f"delete_namespaced_{suffix}")(
                name,
                namespace,
                propagation_policy="Background",
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        client.AppsV1Api(self.api).patch_namespaced_stateful_set(
            name,
            namespace,
            {"spec": {"replicas": replicas}},
            _content_type=MERGE_PATCH,
            _request_timeout=self.timeout,
        )

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": dict(status)},
            _content_type=MERGE_PATCH,
            _request_timeout=self.timeout,
        )

    def event(self, job: Mapping[str, str], type_: str, reason: str, message: str) -> None:
        now = dt.datetime.now(dt.UTC)
        body: Any = {  # the client serialises plain dicts as they are
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{job['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": job["namespace"],
            },
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": job["name"],
                "namespace": job["namespace"],
                "uid": job.get("uid", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "streamtrain-operator"},
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
            "reportingComponent": "streamtrain.io/operator",
        }
        try:
            client.CoreV1Api(self.api).create_namespaced_event(
                job["namespace"], body, _request_timeout=self.timeout
            )
        except ApiException as exc:  # events are best effort: never fail a pass for one
            log.warning("event %s on %s not posted: %s", reason, job["name"], exc.reason)

    def pods(self, namespace: str, selector: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            namespace,
            label_selector=",".join(f"{k}={v}" for k, v in sorted(selector.items())),
            _request_timeout=self.timeout,
        )
        out: dict[str, tuple[str, int]] = {}
        for pod in pods.items:
            statuses = (pod.status and pod.status.container_statuses) or []
            meta = pod.metadata
            if meta is None:
                continue
            restarts = sum(int(s.restart_count or 0) for s in statuses)
            out[str(meta.name)] = (str(meta.uid), restarts)
        return out

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease = client.CoordinationV1Api(self.api).read_namespaced_lease(
                name, namespace, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(self.api.sanitize_for_serialization(lease))

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            lease = client.CoordinationV1Api(self.api).create_namespaced_lease(
                namespace, cast(Any, dict(body)), _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(f"lease {namespace}/{body['metadata']['name']} exists") from exc
            raise
        return dict(self.api.sanitize_for_serialization(lease))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            # A merge-patch that carries ``metadata.resourceVersion`` is conditional: the
            # API server refuses it (409) unless that is the current version.
            lease = client.CoordinationV1Api(self.api).patch_namespaced_lease(
                name,
                namespace,
                dict(body),
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(f"lease {namespace}/{name} changed since it was read") from exc
            raise
        return dict(self.api.sanitize_for_serialization(lease))
