"""Finding the node's GPUs: one interface (``base``), NVML and simulated backends, a factory."""
