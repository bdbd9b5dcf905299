"""Raw JSON access to ResourceSlices and Nodes over a :class:`~dra_driver.kube.KubeClient`.

The generated models lag behind the API (new fields get lost in a model round trip) and would
hide exactly the differences this package has to see, such as fields the server dropped. So
objects stay plain JSON dicts from end to end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from dra_driver import resourceapi
from dra_driver.errors import DriverError
from dra_driver.kube import KubeClient, Response, decode_json

JSON = dict[str, Any]

SLICES_PATH = resourceapi.path(resourceapi.RESOURCE_SLICES)
NODES_PATH = "/api/v1/nodes"

#: Errors that mean "could not talk to the API server" rather than "the server said no".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
    OSError,
)


class ApiError(DriverError):
    """A non-2xx answer from the API server, with the parts worth logging."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        verb: str,
        resource: str,
        name: str | None = None,
        retry_after: float = 0.0,
        body: JSON | None = None,
    ) -> None:
        super().__init__(f"{verb} {resource}{'/' + name if name else ''}: {status} {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.verb = verb
        self.resource = resource
        self.name = name
        self.retry_after = retry_after
        self.body = body or {}


def _retry_after(headers: Mapping[str, str]) -> float:
    try:
        return float(headers.get("Retry-After", "0"))
    except ValueError:
        return 0.0


def _api_error(
    status: int,
    reason: str,
    headers: Mapping[str, str],
    raw: bytes,
    *,
    verb: str,
    resource: str,
    name: str | None = None,
) -> ApiError:
    """An :class:`ApiError` from a non-2xx answer, with the Status body's reason and message."""
    try:
        status_body = json.loads(raw)
    except ValueError:
        status_body = {}
    if not isinstance(status_body, dict):
        status_body = {}
    message = status_body.get("message") or raw.decode("utf-8", "replace")[:500]
    return ApiError(
        status,
        str(status_body.get("reason") or reason or ""),
        message,
        verb=verb,
        resource=resource,
        name=name,
        retry_after=_retry_after(headers),
        body=status_body,
    )


def raise_for_status(
    response: Response, *, verb: str, resource: str, name: str | None = None
) -> None:
    """Raise an :class:`ApiError` for a non-2xx ``response``; return for a 2xx one."""
    if not response.ok:
        raise _api_error(
            response.status,
            response.reason,
            response.headers,
            response.body,
            verb=verb,
            resource=resource,
            name=name,
        )


def _selectors(field_selector: str, label_selector: str) -> list[tuple[str, str]]:
    query = [("fieldSelector", field_selector)] if field_selector else []
    return query + ([("labelSelector", label_selector)] if label_selector else [])


class RawApi:
    """Minimal JSON client: one method per request this package makes, errors as ApiError."""

    def __init__(self, client: KubeClient | RawApi, request_timeout: float = 30.0) -> None:
        """``client`` is owned by the caller; another RawApi shares its client."""
        if isinstance(client, RawApi):
            client = client.api_client
        self._client = client
        self._timeout = request_timeout

    @property
    def api_client(self) -> KubeClient:
        """The underlying :class:`KubeClient`."""
        return self._client

    async def _request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        name: str | None = None,
        query: list[tuple[str, str]] | None = None,
        body: JSON | None = None,
    ) -> Response:
        """Send one request and return the answer (status already checked)."""
        response = await self._client.request(
            method, path, query=query, body=body, timeout=self._timeout
        )
        raise_for_status(response, verb=verb, resource=resource, name=name)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> JSON:
        data = (await self._request(method, path, **kwargs)).json()
        return data if isinstance(data, dict) else {}

    async def get_node(self, name: str) -> JSON:
        """GET one Node."""
        return await self._json(
            "GET", f"{NODES_PATH}/{quote(name, safe='')}", verb="get", resource="nodes", name=name
        )

    async def list_slices(self, field_selector: str) -> JSON:
        """LIST ResourceSlices matching a field selector (the whole list, paging followed)."""
        return await self.list_objects(SLICES_PATH, "resourceslices", field_selector)

    async def list_objects(
        self, path: str, resource: str, field_selector: str = "", *, label_selector: str = ""
    ) -> JSON:
        """LIST the objects at ``path`` (the whole list, paging followed): ``items`` and the
        list's ``metadata`` (its resourceVersion is where a watch starts)."""
        items: list[JSON] = []
        cont = ""
        while True:
            query = _selectors(field_selector, label_selector)
            query.append(("limit", "500"))
            if cont:
                query.append(("continue", cont))
            page = await self._json("GET", path, verb="list", resource=resource, query=query)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return {"items": items, "metadata": meta}

    async def create_slice(self, body: JSON, field_manager: str) -> JSON:
        """POST a ResourceSlice; returns what the server stored."""
        return await self._json(
            "POST",
            SLICES_PATH,
            verb="create",
            resource="resourceslices",
            name=body["metadata"]["name"],
            query=[("fieldManager", field_manager)],
            body=body,
        )

    async def replace_slice(self, body: JSON, field_manager: str) -> JSON:
        """PUT a ResourceSlice (conditional on its resourceVersion); returns what was stored."""
        name = body["metadata"]["name"]
        return await self._json(
            "PUT",
            f"{SLICES_PATH}/{quote(name, safe='')}",
            verb="update",
            resource="resourceslices",
            name=name,
            query=[("fieldManager", field_manager)],
            body=body,
        )

    async def delete_slice(self, name: str, uid: str | None = None) -> bool:
        """DELETE a ResourceSlice; False when it was already gone.

        ``uid`` makes the delete conditional, so a slice recreated under the same name in the
        meantime survives.
        """
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._json(
                "DELETE",
                f"{SLICES_PATH}/{quote(name, safe='')}",
                verb="delete",
                resource="resourceslices",
                name=name,
                body=body,
            )
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[JSON]:
        """Stream watch events (``{"type": ..., "object": ...}``) from ``resource_version``."""
        return self.watch_objects(
            SLICES_PATH, "resourceslices", field_selector, resource_version, timeout_seconds
        )

    async def watch_objects(
        self,
        path: str,
        resource: str,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        label_selector: str = "",
    ) -> AsyncIterator[JSON]:
        """Stream watch events of the objects at ``path`` from ``resource_version``."""
        query = [("watch", "true"), *_selectors(field_selector, label_selector)]
        query += [
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        # No total limit: the server ends the watch after timeoutSeconds. A connection that
        # stays silent well past that is dead (e.g. the server froze), so it is given up.
        async with self._client.stream(
            "GET", path, query=query, connect_timeout=10, read_timeout=timeout_seconds + 30
        ) as response:
            if not response.ok:
                raise _api_error(
                    response.status,
                    response.reason,
                    response.headers,
                    await response.read(),
                    verb="watch",
                    resource=resource,
                )
            async for line in response.lines():
                event = decode_json(line)
                if isinstance(event, dict):
                    yield event
