"""Shared-memory segments that leave no name behind: created, unlinked at once, passed as fds.

Only the standard library is imported: worker processes use :func:`map_fd` before numpy is
loaded (a spawned worker sets BLAS thread counts first).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
from typing import Any

PREFIX = "shmvec_"


# The longest POSIX shared-memory name macOS takes, its leading slash included (PSHMNAMLEN).
MAX_NAME = 31


def segment_name(pid: int) -> str:
    """A new segment's name: ``shmvec_<pid>_<12 hex digits>``, 28 bytes with its leading slash
    for a 7-digit pid (Linux's largest), within macOS's limit of :data:`MAX_NAME`.
    """
    return f"{PREFIX}{pid}_{secrets.token_hex(6)}"


def create(size: int) -> tuple[int, mmap.mmap]:
    """A new segment of ``size`` bytes: ``(fd, mapping)``; its name is already gone.

    ``SharedMemory`` creates it owner-only (0600). We keep a file descriptor and unlink the
    name at once: workers receive the descriptor over their pipe (SCM_RIGHTS), so from here on
    nothing is left in /dev/shm whatever happens to any process, SIGKILL included; the memory
    lives while a mapping or the descriptor does. The caller closes ``fd``.
    """
    from multiprocessing import shared_memory

    name = segment_name(os.getpid())
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    try:
        fd = os.dup(shm._fd)  # type: ignore[attr-defined]  # the only way to its descriptor before 3.13
    finally:
        shm.close()
        shm.unlink()
    return fd, map_fd(os.dup(fd), size)


def map_fd(fd: int, size: int) -> Any:
    """Map a segment from its file descriptor (as passed over a pipe), then close the fd.

    Workers never open a segment by name: they could not register it with the resource
    tracker safely (before Python 3.13 a child's registration unlinks the segment when that
    child exits), and by the time they map it the name is already gone.

    The mapping is a ctypes byte array over ``mmap(2)``'s pages, unmapped when the last view of
    it is gone. It holds no descriptor (``mmap.mmap`` keeps a duplicate of ``fd`` for its
    life until Python 3.13), so closing a vector env releases every descriptor it opened,
    whoever still holds a view.
    """
    try:
        libc = _libc()
        address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of a shared-memory segment of {size} bytes failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    return _mapping_type(size).from_address(address)  # type: ignore[attr-defined]


_MAP_FAILED = ctypes.c_void_p(-1).value
_LIBC: list[Any] = []


def _libc() -> Any:
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _LIBC.append(libc)
    return _LIBC[0]


def _unmap(mapping: Any) -> None:
    _libc().munmap(ctypes.addressof(mapping), ctypes.sizeof(mapping))


def _mapping_type(size: int) -> type:
    """A ctypes array type of ``size`` bytes that unmaps its pages when it is freed (made once
    per size: a type is a reference cycle, left to the collector, so none is made per segment).
    """
    kind = _TYPES.get(size)
    if kind is None:
        kind = _TYPES[size] = type("Mapping", (ctypes.c_ubyte * size,), {"__del__": _unmap, "__slots__": ()})
    return kind


_TYPES: dict[int, type] = {}


class Segment:
    """A segment laid out by ``layout`` (a ``layout.Regions``): the descriptor to hand to
    workers, this process's mapping, and numpy views of every region over it.
    """

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.fd: int | None
        self.fd, self.mapping = create(layout.size)
        self.views: dict[str, Any] = layout.views(self.mapping)

    def close(self) -> None:
        """Close the descriptor. The memory lives on while a mapping does (views handed out
        with ``copy=False`` stay valid). Idempotent.
        """
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
