"""The ``dra-driver`` command: the node agent and the tools around it.

``run`` binds the kubelet's sockets before it loads the settings model and the rest of the
agent (:mod:`dra_driver.bindsettings`), so this module imports as little as it can; every
other command goes through the full parser in :mod:`dra_driver.commands`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dra_driver import exitcodes, logs
from dra_driver.bindsettings import read_socket_settings
from dra_driver.errors import StartError

if TYPE_CHECKING:
    from dra_driver.settings import Settings


def _settings(args: Sequence[str]) -> Settings:
    from dra_driver.commands import parse

    return parse(args).settings


def _dispatch(args: Sequence[str]) -> int:
    early = read_socket_settings(args, os.environ)
    if early is not None:
        logs.configure(early.log_format, early.log_level)
        from dra_driver.launch import run_bound_first

        return run_bound_first(early, lambda: _settings(args))
    from dra_driver.commands import parse

    parsed = parse(args)
    logs.configure(parsed.settings.log_format, parsed.settings.log_level)
    return parsed.command.run(parsed.settings, parsed.namespace)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dra-driver`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    # A failure after the command line parsed: the command is its first word.
    name = args[0] if args else ""
    try:
        return _dispatch(args)
    except StartError as exc:
        print(f"dra-driver {name}: error: {exc}", file=sys.stderr)
        return exitcodes.ERROR
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and nobody to say it to.
        # Point stdout at /dev/null so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exitcodes.ERROR
    except OSError as exc:
        # A directory it cannot create, a port in use: the agent cannot do its job at all.
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"dra-driver {name}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return exitcodes.ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
