"""Sharing: strategies a claim's config asks for (time-slicing, MPS) and shared GPUs."""
