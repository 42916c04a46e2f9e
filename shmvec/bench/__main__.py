"""``python -m shmvec.bench [options]``: the same as ``shmvec bench [options]`` (``... tune ENV`` works too)."""

from __future__ import annotations

import sys

from shmvec.bench.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("bench", "tune", "-h", "--help"):
        argv = ["bench", *argv]
    sys.exit(main(argv))
