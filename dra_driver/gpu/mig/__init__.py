"""MIG geometry and carving: creating and destroying MIG devices (NVML, simulated)."""
