"""The exit statuses of ``dra-driver``, the same for every subcommand.

Scripts tell "the claim does not exist" and "nothing matches" apart from failures and from
mistakes on the command line.
"""

from __future__ import annotations

#: Done; for ``match``, at least one device matched; for ``explain-claim``, nothing blocks.
OK = 0
#: A runtime error: unreadable file, API error, bad credentials, a setting with a bad value.
ERROR = 1
#: A usage error: unknown or missing flags or arguments (as argparse reports them).
USAGE = 2
#: The named object (claim, class) does not exist in the cluster.
NOT_FOUND = 3
#: ``match``: no device matched; ``explain-claim``: something blocks the allocation.
NO_MATCH = 4

#: For ``--help``.
DESCRIPTION = (
    f"exit status: {OK} ok, {ERROR} runtime error, {USAGE} usage error, "
    f"{NOT_FOUND} claim or class not found, {NO_MATCH} no device matches (match) or the "
    "allocation is blocked (explain-claim)"
)
