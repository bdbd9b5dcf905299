"""The development environment: a local control plane, simulated GPU nodes and the demo.

It works only from a checkout (it runs the control plane built by ``make testenv`` and the
examples under ``examples/``), so it is installed by ``make install`` (the ``[dev]`` extra's
editable install) and is not part of the driver's image.
"""
