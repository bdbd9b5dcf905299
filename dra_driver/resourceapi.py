"""The Kubernetes API group and version this driver speaks, and the REST paths under it.

Every request for DeviceClasses, ResourceSlices, ResourceClaims and their templates, and every
object the driver writes, names ``resource.k8s.io/v1`` through this module, so moving to the
next API version is a change in one place.
"""

from __future__ import annotations

import datetime
from urllib.parse import quote

GROUP = "resource.k8s.io"
#: Names the API server accepts (lower-case RFC 1123): a DNS label (a namespace) and a DNS
#: subdomain (a driver, a claim, most objects; at most 253 characters, checked apart).
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = rf"^{DNS_LABEL}(\.{DNS_LABEL})*$"
VERSION = "v1"
#: The ``apiVersion`` field of the group's objects.
API_VERSION = f"{GROUP}/{VERSION}"
#: The REST prefix of the group's resources.
BASE_PATH = f"/apis/{API_VERSION}"

DEVICE_CLASSES = "deviceclasses"
RESOURCE_SLICES = "resourceslices"
RESOURCE_CLAIMS = "resourceclaims"
RESOURCE_CLAIM_TEMPLATES = "resourceclaimtemplates"

#: The value fields of a device attribute that hold lists (DRAListTypeAttributes, alpha 1.36).
LIST_KINDS = ("ints", "bools", "strings", "versions")


def path(resource: str, name: str = "", *, namespace: str = "", subresource: str = "") -> str:
    """The REST path of a collection (no ``name``) or of one object (and its subresource).

    A collection without ``namespace`` spans every namespace (or is cluster-scoped); names
    and namespaces are percent-encoded.
    """
    parts = [BASE_PATH]
    if namespace:
        parts += ["namespaces", quote(namespace, safe="")]
    parts.append(resource)
    if name:
        parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
    return "/".join(parts)


def api_time() -> str:
    """Now as the API server writes a ``metav1.Time``: RFC 3339 in UTC, whole seconds."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
