"""Unit tests for shmvec.layout: region placement, views over a shared buffer, control lines."""

from __future__ import annotations

import mmap
import pickle

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from space_strategies import SETTINGS
from space_strategies import space_trees as space_trees_of

from shmvec.layout import ALIGN, CTRL_WORDS, Layout, RolloutLayout, control_lines
from shmvec.protocol import REPLY_BYTES
from shmvec.tree import PICKLED, space_leaves

space_trees = space_trees_of(depth=2)


# --- helpers ------------------------------------------------------------------------------------


def check_regions(layout) -> None:
    """Every byte-backed region is ALIGN-aligned, inside the segment, and overlaps no other."""
    assert layout.size % ALIGN == 0
    backed = sorted((r for r in layout.regions.values() if r.offset >= 0), key=lambda r: r.offset)
    for r in backed:
        assert r.offset % ALIGN == 0, r
        assert r.offset + r.nbytes <= layout.size, r
    for a, b in zip(backed, backed[1:]):
        assert a.offset + max(a.nbytes, 1) <= b.offset, (a, b)


def address_offset(view: np.ndarray, buf) -> int:
    return view.ctypes.data - np.frombuffer(buf, dtype=np.uint8).ctypes.data


def check_views_over(layout, buf) -> dict[str, np.ndarray]:
    views = layout.views(buf)
    assert set(views) == set(layout.regions)
    for name, r in layout.regions.items():
        v = views[name]
        assert v.shape == r.shape
        assert v.dtype == r.dtype
        if r.offset >= 0:
            assert address_offset(v, buf) == r.offset
            assert address_offset(v, buf) % ALIGN == 0
            assert v.flags.c_contiguous and v.flags.writeable
        else:
            assert v.dtype == PICKLED
            assert all(x is None for x in v.flat)
    return views


def check_shared(layout, buf, seed: int) -> None:
    """Views built twice over the same buffer (the second from a pickled copy of the layout, as a
    worker does) see each other's writes, and no region's writes land in another region."""
    mine = layout.views(buf)
    theirs = pickle.loads(pickle.dumps(layout)).views(buf)
    rng = np.random.default_rng(seed)
    written = {}
    for name, r in layout.regions.items():
        if r.offset < 0:
            continue
        data = rng.integers(0, 256, size=r.nbytes, dtype=np.uint8)
        mine[name].reshape(-1).view(np.uint8)[:] = data
        written[name] = data
    for name, data in written.items():
        np.testing.assert_array_equal(theirs[name].reshape(-1).view(np.uint8), data, err_msg=name)
    # and back: a write from the other side is seen by the first
    for name in written:
        theirs[name].reshape(-1).view(np.uint8)[:] = 0
        assert not mine[name].reshape(-1).view(np.uint8).any()


# --- Layout -------------------------------------------------------------------------------------


@SETTINGS
@given(obs=space_trees, act=space_trees, num_envs=st.integers(1, 9), blocks=st.integers(1, 4),
       final=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_layout_regions_and_views(obs, act, num_envs, blocks, final, seed):
    num_blocks = min(blocks, num_envs)
    layout = Layout.build(obs, act, num_envs, num_blocks, with_final_obs=final)
    check_regions(layout)

    obs_leaves, act_leaves = space_leaves(obs), space_leaves(act)
    assert layout.obs_leaves == obs_leaves
    assert layout.act_leaves == act_leaves

    buf = bytearray(layout.size)
    views = check_views_over(layout, buf)
    for prefix, leaves in (("obs", obs_leaves), ("act", act_leaves)) + ((("final_obs", obs_leaves),) if final else ()):
        leaf_views = layout.leaf_views(views, prefix)
        assert len(leaf_views) == len(leaves)
        for v, leaf in zip(leaf_views, leaves):
            assert v.shape == (num_envs, *leaf.shape)
            assert v.dtype == leaf.dtype
    has_final = any(name.startswith("final_obs/") for name in layout.regions)
    assert has_final == final
    check_shared(layout, buf, seed)


@pytest.mark.parametrize("obs, act", [
    (spaces.Box(-1, 1, (3, 4), np.float32), spaces.Discrete(5)),
    (spaces.Discrete(7, start=-3), spaces.MultiDiscrete([3, 4, 5])),
    (spaces.MultiBinary(5), spaces.MultiBinary([2, 3])),
    (spaces.Box(0, 255, (2, 3, 5), np.uint8), spaces.Box(-1, 1, (), np.float64)),
    (spaces.Dict({"img": spaces.Box(0, 255, (4, 4, 3), np.uint8),
                  "pos": spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3)))}),
     spaces.Tuple((spaces.Discrete(2), spaces.Dict({"a": spaces.MultiBinary(3), "b": spaces.Box(-1, 1, (1,))})))),
])
@pytest.mark.parametrize("final", [False, True])
def test_layout_examples(obs, act, final):
    num_envs, num_blocks = 5, 2
    layout = Layout.build(obs, act, num_envs, num_blocks, with_final_obs=final)
    check_regions(layout)
    buf = mmap.mmap(-1, layout.size)
    views = check_views_over(layout, buf)

    expected = {"ctrl": ((num_blocks + 1, CTRL_WORDS), np.int64),
                "rewards": ((num_envs,), np.float64),
                "terminations": ((num_envs,), np.bool_),
                "truncations": ((num_envs,), np.bool_),
                "autoreset": ((num_envs,), np.bool_),
                "last_return": ((num_envs,), np.float64),
                "last_length": ((num_envs,), np.int64),
                "episode_count": ((num_envs,), np.int64),
                "replies": ((num_blocks, REPLY_BYTES), np.uint8),
                "busy": ((num_blocks, CTRL_WORDS), np.float64)}
    for i, leaf in enumerate(space_leaves(obs)):
        expected[f"obs/{i}"] = ((num_envs, *leaf.shape), leaf.dtype)
        if final:
            expected[f"final_obs/{i}"] = ((num_envs, *leaf.shape), leaf.dtype)
    for i, leaf in enumerate(space_leaves(act)):
        expected[f"act/{i}"] = ((num_envs, *leaf.shape), leaf.dtype)
    assert set(layout.regions) == set(expected)
    for name, (shape, dtype) in expected.items():
        assert views[name].shape == shape, name
        assert views[name].dtype == np.dtype(dtype), name
    check_shared(layout, buf, seed=0)
    assert layout.pickled("obs/", "final_obs/", "act/") == []


def test_leaf_dtypes_follow_spaces():
    obs = spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(4), spaces.MultiDiscrete([2, 2]),
                        spaces.Box(0, 9, (2,), np.int32)))
    layout = Layout.build(obs, spaces.Discrete(2), 3, 1, with_final_obs=False)
    views = layout.views(bytearray(layout.size))
    got = [v.dtype for v in layout.leaf_views(views, "obs")]
    assert got == [np.dtype(np.int64), np.dtype(np.int8), np.dtype(np.int64), np.dtype(np.int32)]
    assert [v.shape for v in layout.leaf_views(views, "obs")] == [(3,), (3, 4), (3, 2), (3, 2)]


def test_zero_sized_leaf_still_gets_its_own_place():
    obs = spaces.Dict({"a": spaces.Box(-1, 1, (0,)), "b": spaces.Box(-1, 1, (2,))})
    layout = Layout.build(obs, spaces.Discrete(2), 2, 1, with_final_obs=True)
    check_regions(layout)
    offsets = [r.offset for r in layout.regions.values()]
    assert len(set(offsets)) == len(offsets)
    views = check_views_over(layout, bytearray(layout.size))
    assert views["obs/0"].shape == (2, 0)


# --- control lines ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_blocks", [1, 2, 5])
def test_control_lines(num_blocks):
    layout = Layout.build(spaces.Box(-1, 1, (3,)), spaces.Discrete(2), 8, num_blocks, with_final_obs=False)
    r = layout.regions["ctrl"]
    assert r.shape == (num_blocks + 1, CTRL_WORDS)
    assert r.nbytes == (num_blocks + 1) * 64
    buf = bytearray(layout.size)
    views = layout.views(buf)
    lines = control_lines(views)
    assert len(lines) == num_blocks + 1
    base = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    for k, line in enumerate(lines):
        assert len(line) == CTRL_WORDS
        assert line.nbytes == 64
        assert line.itemsize == 8
        # each line is one whole cache line of its own
        assert (np.frombuffer(line, dtype=np.int64).ctypes.data - base) % 64 == 0
    # writes through a line land in the ctrl view (of any process mapping the same buffer)
    other = control_lines(pickle.loads(pickle.dumps(layout)).views(buf))
    for k, line in enumerate(lines):
        for w in range(CTRL_WORDS):
            line[w] = 1000 * k + w
    for k in range(num_blocks + 1):
        assert views["ctrl"][k].tolist() == [1000 * k + w for w in range(CTRL_WORDS)]
        assert [other[k][w] for w in range(CTRL_WORDS)] == [1000 * k + w for w in range(CTRL_WORDS)]
        assert type(other[k][0]) is int


# --- with_final_obs -----------------------------------------------------------------------------


def test_with_final_obs_adds_final_obs_regions():
    obs = spaces.Dict({"a": spaces.Box(-1, 1, (2, 2)), "b": spaces.Discrete(4), "c": spaces.MultiBinary(3)})
    without = Layout.build(obs, spaces.Discrete(2), 4, 2, with_final_obs=False)
    with_ = Layout.build(obs, spaces.Discrete(2), 4, 2, with_final_obs=True)
    added = set(with_.regions) - set(without.regions)
    assert added == {"final_obs/0", "final_obs/1", "final_obs/2"}
    assert set(without.regions) <= set(with_.regions)
    assert with_.size > without.size
    views = with_.views(bytearray(with_.size))
    for v, o in zip(with_.leaf_views(views, "final_obs"), with_.leaf_views(views, "obs")):
        assert v.shape == o.shape and v.dtype == o.dtype
        assert not np.shares_memory(v, o)
    with pytest.raises(KeyError):
        without.leaf_views(without.views(bytearray(without.size)), "final_obs")


# --- pickled leaves -----------------------------------------------------------------------------


def test_pickled_leaves_take_no_bytes_and_get_private_arrays():
    obs = spaces.Dict({"img": spaces.Box(-1, 1, (3,)), "txt": spaces.Text(5)})
    act = spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(3))))
    layout = Layout.build(obs, act, 3, 1, with_final_obs=True)
    plain = Layout.build(spaces.Dict({"img": spaces.Box(-1, 1, (3,))}), spaces.Tuple((spaces.Discrete(2),)),
                         3, 1, with_final_obs=True)
    check_regions(layout)
    assert layout.size == plain.size
    assert layout.regions["obs/1"].offset == -1
    assert layout.pickled("obs/") == ["obs/1"]
    assert layout.pickled("final_obs/") == ["final_obs/1"]
    assert layout.pickled("act/") == ["act/1"]
    assert sorted(layout.pickled("obs/", "final_obs/", "act/")) == ["act/1", "final_obs/1", "obs/1"]
    buf = bytearray(layout.size)
    a, b = layout.views(buf), layout.views(buf)
    assert a["obs/1"].shape == (3,) and a["obs/1"].dtype == PICKLED
    a["obs/1"][0] = "hello"
    assert b["obs/1"][0] is None  # private to each call


# --- RolloutLayout ------------------------------------------------------------------------------


@SETTINGS
@given(obs=space_trees, act=space_trees, num_envs=st.integers(1, 6), num_steps=st.integers(1, 7),
       final=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_rollout_layout(obs, act, num_envs, num_steps, final, seed):
    layout = Layout.build(obs, act, num_envs, 1, with_final_obs=final)
    ro = RolloutLayout.build(layout, num_steps)
    check_regions(ro)
    assert ro.num_envs == num_envs and ro.num_steps == num_steps
    assert "ctrl" not in ro.regions and "replies" not in ro.regions
    buf = bytearray(ro.size)
    views = check_views_over(ro, buf)
    t, n = num_steps, num_envs
    for v, leaf in zip(ro.leaf_views(views, "obs"), layout.obs_leaves):
        assert v.shape == (t + 1, n, *leaf.shape) and v.dtype == leaf.dtype
    for v, leaf in zip(ro.leaf_views(views, "act"), layout.act_leaves):
        assert v.shape == (t, n, *leaf.shape) and v.dtype == leaf.dtype
    if final:
        for v, leaf in zip(ro.leaf_views(views, "final_obs"), layout.obs_leaves):
            assert v.shape == (t, n, *leaf.shape) and v.dtype == leaf.dtype
    else:
        assert not any(name.startswith("final_obs/") for name in ro.regions)
    assert views["rewards"].shape == (t, n) and views["rewards"].dtype == np.float64
    for flag in ("terminations", "truncations"):
        assert views[flag].shape == (t, n) and views[flag].dtype == np.bool_
    check_shared(ro, buf, seed)
