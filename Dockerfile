# syntax=docker/dockerfile:1
#
# Image of the GPU DRA driver's node agent (`dra-driver run`, see manifests/base).
#
# Base image: pinned by exact tag. Pin it by digest as well when publishing
# (python:3.11.14-slim-bookworm@sha256:<digest>, from `docker buildx imagetools inspect`)
# so that a rebuilt tag cannot change the image underneath.
#
# NVIDIA software is not in the image; it comes from the host at run time:
# - libnvidia-ml.so.1 (NVML), from the NVIDIA driver root the DaemonSet mounts read-only at
#   /driver-root (DRA_DRIVER_ROOT). It must match the host's kernel module, which is why it
#   is never baked into the image. Required with the nvml backend.
# - nvidia-smi, from the same driver root: sets the time-slice compute policy of GPUs whose
#   claims ask for time-slicing (`nvidia-smi compute-policy --set-timeslice`).
# - nvidia-cuda-mps-control, from the same driver root: runs the MPS control daemons of
#   claims configured for MPS and of GPUs shared by memory (--shared-gpus).
# - the driver's user-space libraries (libcuda, libnvidia-ml, ...), tools, firmware and the
#   daemons' sockets, found under the same driver root by the agent, which mounts them into
#   claims' containers through their CDI specs (docs/cdi.md); nothing else is needed.
# - nvidia-ctk (NVIDIA Container Toolkit), optional: when on PATH (a derived image),
#   `nvidia-ctk cdi generate` supplies those edits instead, with its loader-cache hooks.
#
# The agent runs as root in a privileged container (see the DaemonSet): it creates sockets in
# the kubelet's root-owned directories, writes CDI specs for the container runtime and opens
# the GPU device nodes. A non-root user cannot do that, so the image does not set USER.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- builder: a wheel of the driver and of every dependency --------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY dra_driver ./dra_driver
# All dependencies ship binary wheels for linux/amd64 and linux/arm64, so no compiler is
# needed; --only-binary makes a missing wheel fail here instead of pulling in a toolchain.
RUN pip wheel --wheel-dir /wheels --only-binary=:all: --no-binary=dra-driver .

# --- runtime: the wheels installed, nothing to build with -----------------------------------
FROM ${PYTHON_IMAGE}

# PYTHONOPTIMIZE=2 drops docstrings (and asserts, which the driver uses only to narrow types)
# from every module loaded: 2.5 MiB less resident memory per agent. The bytecode of that level
# is compiled here, for the standard library too: nothing is written at run time, so a module
# without it would be compiled again at every start.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONOPTIMIZE=2 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/dra_driver-*.whl \
    && pip uninstall -y pip setuptools wheel \
    && python -m compileall -q -j 0 -o 2 -x '/(test|tests|idle_test)/' \
        "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
        "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"

# The agent's defaults (sockets, CDI directory) are the kubelet's and runtime's host paths;
# the DaemonSet mounts them. gRPC health port for the liveness probe and metrics port:
EXPOSE 51515 8080

ENTRYPOINT ["dra-driver"]
CMD ["run"]
