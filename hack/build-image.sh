#!/usr/bin/env bash
# Build (and optionally push) the node agent's image for several architectures with
# docker buildx. The Dockerfile installs binary wheels only (--only-binary), and every
# dependency publishes wheels for linux/amd64 and linux/arm64, so no emulated compiler runs:
# QEMU only executes pip in the arm64 stages.
#
#   IMAGE=registry.example.com/dra-driver TAG=v0.1.1 hack/build-image.sh          # build
#   IMAGE=registry.example.com/dra-driver TAG=v0.1.1 PUSH=1 hack/build-image.sh   # and push
#
# Variables:
#   IMAGE      repository (default ghcr.io/example/dra-driver, the chart's image.repository)
#   TAG        tag (default: the version in pyproject.toml with a leading v, the chart's appVersion)
#   PLATFORMS  default linux/amd64,linux/arm64
#   PUSH       1 pushes the multi-arch manifest list; otherwise the build is only checked
#              (a multi-platform result cannot be loaded into the local docker image store)
#   BUILDER    buildx builder to use (default: one named dra-driver, created with the
#              docker-container driver when missing, which multi-platform builds need)
#   PYTHON_IMAGE  base image override (pin it by digest for releases)
#
# Needs docker with buildx, and binfmt handlers for the foreign architectures
# (docker run --privileged --rm tonistiigi/binfmt --install arm64) unless the builder has
# native nodes for them.
set -euo pipefail

cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
IMAGE=${IMAGE:-ghcr.io/example/dra-driver}
TAG=${TAG:-v${version}}
PLATFORMS=${PLATFORMS:-linux/amd64,linux/arm64}
BUILDER=${BUILDER:-dra-driver}
PUSH=${PUSH:-0}

if ! docker buildx version >/dev/null 2>&1; then
  echo "docker buildx is needed for a multi-architecture build" >&2
  exit 1
fi
if ! docker buildx inspect "$BUILDER" >/dev/null 2>&1; then
  docker buildx create --name "$BUILDER" --driver docker-container >/dev/null
fi

args=(--builder "$BUILDER" --platform "$PLATFORMS" --tag "$IMAGE:$TAG"
      --label "org.opencontainers.image.version=$TAG"
      --label "org.opencontainers.image.licenses=Apache-2.0")
if [[ -n "${PYTHON_IMAGE:-}" ]]; then
  args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
fi
if [[ "$PUSH" == 1 ]]; then
  args+=(--push)
fi

echo "building $IMAGE:$TAG for $PLATFORMS (push: $PUSH)"
docker buildx build "${args[@]}" .
