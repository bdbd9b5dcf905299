"""Write small container images as OCI archives, without a registry or a build tool.

The real test node imports these with containerd's client (``ctr images import``):

    python ociimage.py busybox --out busybox.tar   # localhost/dra-test/busybox:local
    python ociimage.py pause --binary PAUSE --out pause.tar

An archive is an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/*``) in a
tar file, with one gzip layer. Layers are reproducible: fixed owners and times, sorted
entries, so the same inputs always give the same image digest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BUSYBOX_IMAGE = "localhost/dra-test/busybox:local"
PAUSE_IMAGE = "localhost/dra-test/pause:local"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Directories every image has, so that mounts and a working directory have a target.
BASE_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "var/run")


@dataclass(frozen=True)
class Entry:
    """One file in a layer: a regular file copied from the host, a symlink or a directory."""

    path: str
    source: Path | None = None
    link: str | None = None
    mode: int = 0o755


@dataclass
class Image:
    """What goes into an image: its reference, its files and its process."""

    name: str
    entries: list[Entry] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: [DEFAULT_PATH])


def layer_tar(entries: Sequence[Entry]) -> bytes:
    """An uncompressed tar of `entries`, parents first, owned by root, timestamp 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(entry.path)
            info.mode = entry.mode
            if entry.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                tar.addfile(info)
            elif entry.source is not None:
                data = entry.source.read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def oci_archive(image: Image) -> bytes:
    """The OCI image layout of `image` as a tar archive (the ``ctr images import`` input)."""
    raw = layer_tar(image.entries)
    compressed = gzip.compress(raw, mtime=0)
    blobs: dict[str, bytes] = {}
    layer = _blob(blobs, compressed, "application/vnd.oci.image.layer.v1.tar+gzip")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": image.env, "Entrypoint": image.entrypoint, "Cmd": image.cmd},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
    }
    config_desc = _blob(
        blobs, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer],
    }
    manifest_desc = _blob(
        blobs, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    # containerd names the imported image after this annotation.
    manifest_desc["annotations"] = {
        "io.containerd.image.name": image.name,
        "org.opencontainers.image.ref.name": image.name.rsplit(":", 1)[-1],
    }
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **{f"blobs/sha256/{d.split(':', 1)[1]}": data for d, data in blobs.items()},
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def busybox_image(busybox: Path) -> Image:
    """`BUSYBOX_IMAGE`: a static busybox with a link for every applet it has."""
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    entries = [Entry(d) for d in BASE_DIRS]
    entries.append(Entry("bin/busybox", source=busybox))
    entries += [Entry(f"bin/{a}", link="busybox") for a in applets if a != "busybox"]
    return Image(BUSYBOX_IMAGE, entries, entrypoint=[], cmd=["sh"])


def pause_image(binary: Path) -> Image:
    """`PAUSE_IMAGE`: the sandbox image, a single static program."""
    entries = [Entry(d) for d in BASE_DIRS]
    entries.append(Entry("pause", source=binary))
    return Image(PAUSE_IMAGE, entries, entrypoint=["/pause"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("busybox", "pause"))
    parser.add_argument("--binary", type=Path, help="busybox (default /bin/busybox) or pause")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.kind == "busybox":
        image = busybox_image(args.binary or Path("/bin/busybox"))
    elif args.binary is None:
        parser.error("pause needs --binary")
    else:
        image = pause_image(args.binary)
    args.out.write_bytes(oci_archive(image))
    print(f"{image.name} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
