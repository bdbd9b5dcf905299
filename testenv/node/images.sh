#!/bin/sh
# Build the driver's image from the project's Dockerfile with no registry, and write it as
# an OCI archive for containerd:
#
#   testenv/node/images.sh BUILD_DIR IMAGE_REF
#
# The Dockerfile starts FROM python:<version>-slim-bookworm. That image cannot be pulled
# here, so an equivalent is assembled from Debian's own packages and tagged with the same
# name: Debian bookworm's python3 (the Python minor version the Dockerfile names) in a
# virtual environment at /usr/local, which gives the layout the Dockerfile relies on
# (/usr/local/bin/python and pip, packages in /usr/local/lib/python3.11/site-packages,
# a pip that `pip uninstall pip` may remove). Then `buildah bud --pull=never` builds the
# Dockerfile unchanged. Pip inside the build reaches the package index through the host's
# network and CA bundle, as a CI builder would. RUN steps use chroot isolation: they need no
# OCI runtime (Debian's crun refuses this machine's hybrid cgroup layout) and no cgroups.
set -eu
build_dir=$1
image=$2
repo_root=$(cd "$(dirname "$0")/../.." && pwd)
store="$build_dir/buildah"
bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver overlay "$@"; }

base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$repo_root/Dockerfile")
[ -n "$base" ] || { echo "images.sh: no ARG PYTHON_IMAGE in Dockerfile" >&2; exit 1; }
case "$base" in
  python:3.11*-bookworm) ;;
  *) echo "images.sh: cannot assemble $base from Debian bookworm (python3 is 3.11)" >&2; exit 1 ;;
esac
mkdir -p "$build_dir"

if ! bah inspect --type image "docker.io/library/$base" >/dev/null 2>&1; then
  echo "assembling $base from Debian bookworm packages"
  rootfs="$build_dir/python-base.tar"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --customize-hook='chroot "$1" python3 -m venv /usr/local' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$rootfs"
  ctr=$(bah from --pull=never scratch)
  bah add "$ctr" "$rootfs" /
  bah config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  bah commit --quiet --rm "$ctr" "docker.io/library/$base" >/dev/null
  rm -f "$rootfs"
fi

echo "building $image from $repo_root/Dockerfile"
# No --layers: this buildah (Debian's 1.28) keys the cache of the runtime stage's
# `RUN --mount=type=bind,from=builder` on the command alone, so with a layer cache a rebuilt
# image kept installing the previous build's wheel (the agent ran code older than the
# checkout). make rebuilds the image only when the sources changed, when the wheel must be
# rebuilt anyway.
bah bud --quiet --pull=never --isolation=chroot --network=host \
  --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  -t "$image" -f "$repo_root/Dockerfile" "$repo_root" >/dev/null
rm -f "$build_dir/driver.tar"
bah push --quiet "$image" "oci-archive:$build_dir/driver.tar:$image"
echo "$image -> $build_dir/driver.tar"
