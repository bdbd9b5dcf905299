"""Raw JSON access to ResourceSlices and Nodes over a ``kubernetes.aio`` ApiClient.

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

JSON = dict[str, Any]

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
NODES_PATH = "/api/v1/nodes"

#: Errors that mean "could not talk to the API server" rather than "the server said no".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
    OSError,
)


class ApiError(Exception):
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


class RawApi:
    """Minimal JSON client: one method per request this package makes, errors as ApiError."""

    def __init__(self, api_client: Any, request_timeout: float = 30.0) -> None:
        # Accept an ApiClient, a generated API object that carries one, or another RawApi.
        if isinstance(api_client, RawApi):
            api_client = api_client.api_client
        self._client: Any = getattr(api_client, "api_client", api_client)
        self._timeout = request_timeout

    @property
    def api_client(self) -> Any:
        """The underlying ``kubernetes.aio`` ApiClient."""
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
        request_timeout: float | aiohttp.ClientTimeout | None = None,
    ) -> Any:
        """Send one request and return the raw REST response (status already checked)."""
        serialized = await self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = await self._client.call_api(
            *serialized,
            _preload_content=False,
            _request_timeout=request_timeout or self._timeout,
        )
        if 200 <= response.status < 300:
            return response
        raw = await response.read()
        response.response.release()
        try:
            status_body = json.loads(raw)
        except ValueError:
            status_body = {}
        if not isinstance(status_body, dict):
            status_body = {}
        message = status_body.get("message") or raw.decode("utf-8", "replace")[:500]
        raise ApiError(
            response.status,
            str(status_body.get("reason") or response.reason or ""),
            message,
            verb=verb,
            resource=resource,
            name=name,
            retry_after=_retry_after(response.headers),
            body=status_body,
        )

    async def _json(self, method: str, path: str, **kwargs: Any) -> JSON:
        response = await self._request(method, path, **kwargs)
        data = json.loads(await response.read())
        return data if isinstance(data, dict) else {}

    async def get_node(self, name: str) -> JSON:
        """GET one Node."""
        return await self._json(
            "GET", f"{NODES_PATH}/{quote(name, safe='')}", verb="get", resource="nodes", name=name
        )

    async def create_node(self, body: JSON) -> JSON:
        """POST a Node (used by tests and the local demo cluster)."""
        return await self._json("POST", NODES_PATH, verb="create", resource="nodes", body=body)

    async def delete_node(self, name: str) -> None:
        """DELETE one Node; a missing node is not an error."""
        try:
            await self._json(
                "DELETE",
                f"{NODES_PATH}/{quote(name, safe='')}",
                verb="delete",
                resource="nodes",
                name=name,
            )
        except ApiError as err:
            if err.status != 404:
                raise

    async def list_slices(self, field_selector: str) -> JSON:
        """LIST ResourceSlices matching a field selector (the whole list, paging followed)."""
        items: list[JSON] = []
        cont = ""
        while True:
            query = [("fieldSelector", field_selector), ("limit", "500")]
            if cont:
                query.append(("continue", cont))
            page = await self._json(
                "GET", SLICES_PATH, verb="list", resource="resourceslices", query=query
            )
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

    async def watch_slices(
        self, field_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[JSON]:
        """Stream watch events (``{"type": ..., "object": ...}``) from ``resource_version``.

        Lines are split by hand rather than with the stream's readline, whose 128 KiB line
        limit a slice of 128 richly described devices can exceed.
        """
        query = [
            ("watch", "true"),
            ("fieldSelector", field_selector),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        # No total limit: the server ends the watch after timeoutSeconds. A connection that
        # stays silent well past that is dead (e.g. the server froze), so it is given up.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30)
        response = await self._request(
            "GET",
            SLICES_PATH,
            verb="watch",
            resource="resourceslices",
            query=query,
            request_timeout=timeout,
        )
        raw = response.response
        buffer = b""
        try:
            async for chunk in raw.content.iter_any():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
            if buffer.strip():
                event = json.loads(buffer)
                if isinstance(event, dict):
                    yield event
        finally:
            raw.release()
