"""Kubernetes DRA driver for NVIDIA GPUs."""


def package_version() -> str:
    """The installed package's version ("unknown" when run from a source tree never
    installed). Looked up on demand: the lookup reads every installed package's metadata."""
    from importlib import metadata

    try:
        return metadata.version("dra-driver")
    except metadata.PackageNotFoundError:
        return "unknown"
