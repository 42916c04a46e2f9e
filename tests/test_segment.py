"""Unit tests for shmvec.segment: nameless shared-memory segments passed as file descriptors."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from multiprocessing import reduction

import numpy as np
import pytest
from gymnasium import spaces

from shmvec.layout import Layout
from shmvec.segment import PREFIX, Segment, create, map_fd


def own_entries() -> set[str]:
    """This process's segment names in /dev/shm (other processes may hold theirs)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"{PREFIX}{os.getpid()}_")}


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def small_layout() -> Layout:
    obs = spaces.Dict({"img": spaces.Box(0, 255, (4, 4), np.uint8), "v": spaces.Box(-1, 1, (3,))})
    return Layout.build(obs, spaces.Discrete(3), num_envs=4, num_blocks=2, with_final_obs=True)


# --- create / map_fd ----------------------------------------------------------------------------


def raw(mapping) -> memoryview:
    """A mapping's bytes, sliced and assigned as bytes (the mapping is a ctypes byte array)."""
    return memoryview(mapping).cast("B")


@pytest.mark.parametrize("size", [1, 64, 4096, 100_000])
def test_create_leaves_no_name_behind(size):
    before = own_entries()
    fd, mapping = create(size)
    try:
        assert own_entries() == before
        assert len(mapping) == size
        assert os.fstat(fd).st_size >= size
        assert raw(mapping).tobytes() == bytes(size)  # a new segment is zero-filled
    finally:
        del mapping
        os.close(fd)
    assert own_entries() == before


def test_create_gives_distinct_segments():
    fd1, m1 = create(64)
    fd2, m2 = create(64)
    try:
        raw(m1)[:4] = b"abcd"
        assert raw(m2)[:4].tobytes() == b"\0\0\0\0"
    finally:
        for fd in (fd1, fd2):
            os.close(fd)


def test_map_fd_maps_the_same_memory():
    size = 8192
    fd, mine = create(size)
    try:
        other = map_fd(os.dup(fd), size)
        raw(mine)[:5] = b"hello"
        raw(mine)[size - 3 :] = b"end"
        assert raw(other)[:5].tobytes() == b"hello"
        assert raw(other)[size - 3 :].tobytes() == b"end"
        raw(other)[100:103] = b"abc"
        assert raw(mine)[100:103].tobytes() == b"abc"
        del other  # unmapped: the last view of it is gone
        # the memory lives on through the descriptor: a third mapping still sees it
        third = map_fd(os.dup(fd), size)
        assert raw(third)[:5].tobytes() == b"hello"
    finally:
        os.close(fd)


def test_memory_outlives_the_descriptor():
    size = 256
    fd, mine = create(size)
    other = map_fd(os.dup(fd), size)
    os.close(fd)
    raw(mine)[:3] = b"xyz"
    assert raw(other)[:3].tobytes() == b"xyz"
    del mine
    raw(other)[3:6] = b"uvw"
    assert raw(other)[:6].tobytes() == b"xyzuvw"


def test_a_mapping_holds_no_descriptor_and_is_unmapped_with_its_last_view():
    """mmap.mmap kept a duplicate descriptor per mapping (until Python 3.13): this one keeps
    none, and its pages go when the last view of them does."""
    fds = len(os.listdir("/proc/self/fd"))
    fd, mine = create(4096)
    os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == fds
    view = np.frombuffer(mine, dtype=np.uint8)
    address = view.ctypes.data
    del mine
    view[:2] = 7  # still mapped: the view holds it

    def mapped() -> bool:
        with open("/proc/self/maps") as f:
            return any(int(line.split("-")[0], 16) <= address < int(line.split()[0].split("-")[1], 16)
                       for line in f if PREFIX in line)  # fmt: skip

    assert mapped()
    del view
    assert not mapped()


def test_map_fd_closes_the_descriptor():
    fd, mine = create(64)
    try:
        dup = os.dup(fd)
        mapping = map_fd(dup, 64)
        assert not is_open(dup)
        assert is_open(fd)  # only the one handed over
        del mapping
    finally:
        os.close(fd)


def test_map_fd_closes_the_descriptor_on_failure():
    with tempfile.TemporaryFile() as f:  # an empty file cannot be mapped
        dup = os.dup(f.fileno())
        with pytest.raises((ValueError, OSError)):
            map_fd(dup, 0)
        assert not is_open(dup)


# --- Segment ------------------------------------------------------------------------------------


def test_segment_views_follow_the_layout():
    layout = small_layout()
    before = own_entries()
    seg = Segment(layout)
    try:
        assert own_entries() == before
        assert seg.layout is layout
        assert len(seg.mapping) == layout.size
        assert set(seg.views) == set(layout.regions)
        for name, r in layout.regions.items():
            assert seg.views[name].shape == r.shape and seg.views[name].dtype == r.dtype
        # another mapping of the descriptor, as a worker makes, sees the same arrays
        other = layout.views(map_fd(os.dup(seg.fd), layout.size))
        seg.views["rewards"][:] = [1.5, 2.5, 3.5, 4.5]
        seg.views["obs/0"][2] = 7
        np.testing.assert_array_equal(other["rewards"], [1.5, 2.5, 3.5, 4.5])
        assert (other["obs/0"][2] == 7).all() and (other["obs/0"][[0, 1, 3]] == 0).all()
        other["act/0"][:] = [2, 1, 0, 2]
        np.testing.assert_array_equal(seg.views["act/0"], [2, 1, 0, 2])
    finally:
        seg.close()


def test_segment_close_is_idempotent_and_views_stay_valid():
    seg = Segment(small_layout())
    fd = seg.fd
    assert is_open(fd)
    seg.close()
    assert seg.fd is None
    assert not is_open(fd)
    seg.close()  # a second close does nothing
    assert seg.fd is None
    views = seg.views
    views["rewards"][:] = 3.0
    views["ctrl"][0, 0] = 42
    assert (views["rewards"] == 3.0).all()
    assert views["ctrl"][0, 0] == 42
    assert seg.mapping[:1] is not None  # the mapping itself is still open


# --- a child process ----------------------------------------------------------------------------


def _child(conn, layout) -> None:
    try:
        fd = reduction.recv_handle(conn)
        mapping = map_fd(fd, layout.size)
        views = layout.views(mapping)
        conn.send(views["rewards"].tolist())
        views["last_length"][:] = [10, 20, 30, 40]
        views["obs/1"][1] = -0.5
        conn.send("written")
        conn.recv()  # keep the mapping until the parent has looked
    except BaseException as e:  # report rather than hang the parent
        conn.send(repr(e))
    finally:
        conn.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # (a forked child, by name)
def test_child_process_shares_the_segment():
    layout = small_layout()
    seg = Segment(layout)
    ctx = mp.get_context("fork")
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_child, args=(child_conn, layout), name="segment-test-child", daemon=True)
    try:
        seg.views["rewards"][:] = [0.25, 0.5, 0.75, 1.0]
        proc.start()
        child_conn.close()
        reduction.send_handle(parent_conn, seg.fd, proc.pid)
        seg.close()  # the child has its own descriptor now
        assert parent_conn.poll(10.0)
        assert parent_conn.recv() == [0.25, 0.5, 0.75, 1.0]
        assert parent_conn.poll(10.0)
        assert parent_conn.recv() == "written"
        np.testing.assert_array_equal(seg.views["last_length"], [10, 20, 30, 40])
        np.testing.assert_array_equal(seg.views["obs/1"][1], [-0.5, -0.5, -0.5])
        assert (seg.views["obs/1"][[0, 2, 3]] == 0).all()
        parent_conn.send("bye")
        proc.join(10.0)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
        parent_conn.close()
        seg.close()


def _mapped_segments() -> int:
    """How many of shmvec's segments this process maps (their names, deleted, in its maps)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if f"/{PREFIX}" in line)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc (Linux)")
def test_close_releases_every_descriptor_and_mapping_without_the_collector():
    """Thirty build-step-rollout-recv-close cycles, with the cyclic garbage collector off: after each
    close(), with the env still referenced, this process holds no more descriptors than before
    and maps none of its segments (the main one, the rollout's, the info columns'); a view
    handed out with copy=False keeps its segment mapped, and valid, until it goes."""
    import gc

    from envs_for_tests import NestedEnv

    import shmvec
    from shmvec.envs import SyntheticEnv

    def frames():
        return SyntheticEnv(obs_shape=(84, 84, 4), obs_dtype="uint8", step_us=0.0, reset_us=0.0, episode_steps=7)

    import gymnasium as gym

    envs = shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2, num_workers=1)  # (one-time set-up: the
    envs.close()  # resource tracker's pipe, compiled barrier) before the counts are taken
    gc.collect()
    gc.disable()
    try:
        fds = _descriptors()
        assert _mapped_segments() == 0
        for i in range(30):
            kind = [frames, NestedEnv][i % 2]  # (NestedEnv's scalar infos get their segment of columns)
            envs = shmvec.ShmVecEnv([kind] * 8, num_workers=2)
            envs.reset(seed=i)
            envs.step(envs.action_space.sample())
            envs.rollout(lambda obs: envs.action_space.sample(), num_steps=3)
            envs.close()
            assert (_descriptors(), _mapped_segments()) == (fds, 0), f"cycle {i}"
            envs = shmvec.ShmVecEnv([kind] * 8, num_workers=2, batch_size=4)
            envs.async_reset(seed=i)
            for copy in (True, False):  # (a batch keeps its views of the results: dropped at close)
                envs.copy = copy
                envs.recv()
            envs.close()
            assert (_descriptors(), _mapped_segments()) == (fds, 0), f"cycle {i}"
        envs = shmvec.ShmVecEnv([frames] * 4, num_workers=2, copy=False)
        obs, _ = envs.reset(seed=0)
        kept = np.array(obs)
        envs.close()
        assert _mapped_segments() == 1 and _descriptors() == fds  # the view's segment: memory, no descriptor
        assert (obs == kept).all()
        del obs
        assert _mapped_segments() == 0
    finally:
        gc.enable()
