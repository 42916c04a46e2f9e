"""Cap the thread pools of numeric libraries inside a worker process.

Each library sizes its pool by the machine's cores: 16 workers on 16 cores, each with OpenCV's
(which Gymnasium's ``AtariPreprocessing`` resizes with), torch's, numba's and BLAS's 16
threads, make hundreds of threads fight over the cores the workers need. A worker steps its
envs one after the other, so one thread each is the rule; ``ShmVecEnv(worker_threads=k)``
lifts it, ``None`` leaves the libraries alone.

Only the standard library is imported here: a spawned worker calls :func:`cap_variables`
before anything imports numpy.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["THREAD_VARS", "cap_libraries", "cap_variables", "library_threads"]

# Read by OpenMP, OpenBLAS, MKL, numexpr, Accelerate and numba when they start their pools.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def cap_variables(threads: int | None) -> None:
    """Set the thread-count variables to ``threads`` for the libraries not loaded yet (under
    spawn and forkserver: all of them). A variable the user set is kept.
    """
    if threads is None:
        return
    for var in THREAD_VARS:
        os.environ.setdefault(var, str(threads))


def cap_libraries(threads: int | None) -> None:
    """Set the pools of the libraries this process has loaded (inherited under fork, or
    imported by the envs' constructors) to ``threads``.
    """
    if threads is None:
        return
    modules = sys.modules
    if "cv2" in modules:
        modules["cv2"].setNumThreads(threads)
    if "torch" in modules:
        torch = modules["torch"]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    parallel: Any = modules.get("numba.np.ufunc.parallel")
    if parallel is not None:
        if parallel._is_initialized:  # the pool runs (launched here): use fewer of its threads
            parallel.set_num_threads(min(threads, parallel.NUM_THREADS))
        else:  # size the pool it will launch (asking its size now would launch it)
            parallel.NUM_THREADS = threads
    try:  # BLAS pools already started (numpy loaded before the fork): through threadpoolctl, if there
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(threads)


def library_threads() -> dict[str, int]:
    """The pool sizes of the loaded libraries (for tests and for users checking a worker)."""
    modules = sys.modules
    out = {}
    if "cv2" in modules:
        out["cv2"] = modules["cv2"].getNumThreads()
    if "torch" in modules:
        out["torch"] = modules["torch"].get_num_threads()
    parallel: Any = modules.get("numba.np.ufunc.parallel")
    if parallel is not None:
        out["numba"] = parallel.get_num_threads() if parallel._is_initialized else parallel.NUM_THREADS
    return out
