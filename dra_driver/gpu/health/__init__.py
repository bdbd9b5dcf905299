"""GPU health: events in, device taints and the kubelet's health stream out, re-checks to
clear them.

Sources of events are the NVML event loop on real hardware (critical Xid errors, double-bit
ECC errors, a GPU that fell off the bus) and, on simulated nodes, a file that
``dra-driver inject-health`` edits. The tracker turns them into per-device taints (so the
scheduler stops placing new claims there) and health states (so the kubelet shows them in
pod status); the re-check clears them once the device is healthy again.
"""
