"""Entry point of ``python -m devenv.localcluster``."""

import sys

from devenv.localcluster.cli import main

sys.exit(main())
