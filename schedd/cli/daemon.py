"""``schedd``: one node of a schedd cluster.  With no arguments, a working single-node cluster.

This entry point imports only the standard library itself, so that an installation missing one
of schedd's dependencies is reported as one line naming the module, not as a traceback.  The
node is :mod:`schedd.cli.node`.
"""

from __future__ import annotations

import sys


def missing_module(exc: ImportError) -> str:
    """One line for a dependency that cannot be imported."""
    what = f"the Python module '{exc.name}'" if exc.name else "a Python module schedd needs"
    return (
        f"schedd: cannot start: {what} cannot be imported ({exc}); install schedd with its "
        "dependencies (pip install schedd)"
    )


def main(argv: list[str] | None = None) -> int:
    try:
        from schedd.cli.node import main as node_main

        return node_main(argv)
    except ImportError as exc:
        print(missing_module(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
