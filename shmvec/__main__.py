"""``shmvec`` / ``python -m shmvec``: the ``bench`` and ``tune`` subcommands.

>>> # shell: shmvec bench --quick          (a one-minute throughput report)
>>> # shell: shmvec tune CartPole-v1 --num-envs 64
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shmvec`` command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    from shmvec.bench.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
