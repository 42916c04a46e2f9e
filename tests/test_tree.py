"""Unit tests for shmvec.tree: spaces as flat lists of leaves, samples flattened and rebuilt."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from space_strategies import SETTINGS
from space_strategies import space_trees as space_trees_of

from shmvec.tree import PICKLED, Leaf, assemble, flatten, pickled_fields, space_leaves

space_trees = space_trees_of(depth=3)
seeds = st.integers(0, 2**32 - 1)


# --- helpers ------------------------------------------------------------------------------------


def sample(space: spaces.Space, seed: int) -> Any:
    space.seed(seed)
    return space.sample()


def get_path(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def assert_same(a: Any, b: Any) -> None:
    """Same structure (dict key order, tuple types), same leaf values and dtypes."""
    if isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, tuple):
        assert type(b) is tuple
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(a, b)


def gym_leaf_order(space: spaces.Space) -> list[spaces.Space]:
    """The leaf spaces in the order Gymnasium iterates a Dict (its keys) and a Tuple."""
    if isinstance(space, spaces.Dict):
        return [leaf for key in space.keys() for leaf in gym_leaf_order(space[key])]
    if isinstance(space, spaces.Tuple):
        return [leaf for sub in space for leaf in gym_leaf_order(sub)]
    return [space]


# --- space_leaves -------------------------------------------------------------------------------


@pytest.mark.parametrize("space, shape, dtype", [
    (spaces.Box(-1, 1, (2, 3), np.float32), (2, 3), np.float32),
    (spaces.Box(0, 255, (), np.uint8), (), np.uint8),
    (spaces.Discrete(4), (), np.int64),
    (spaces.MultiDiscrete([2, 3]), (2,), np.int64),
    (spaces.MultiDiscrete([[2, 3], [4, 5]]), (2, 2), np.int64),
    (spaces.MultiBinary(5), (5,), np.int8),
    (spaces.MultiBinary([2, 4]), (2, 4), np.int8),
])
def test_flat_space_is_one_leaf(space, shape, dtype):
    leaves = space_leaves(space)
    assert leaves == [Leaf((), shape, np.dtype(dtype), space)]
    assert leaves[0].field == ""
    assert not leaves[0].pickled


def test_space_leaves_dict_order_is_gymnasiums():
    # Gymnasium sorts the keys of a plain dict; an OrderedDict keeps its order
    sorted_dict = spaces.Dict({"z": spaces.Discrete(2), "a": spaces.Discrete(3), "m": spaces.Discrete(4)})
    assert [leaf.path for leaf in space_leaves(sorted_dict)] == [(k,) for k in sorted_dict.keys()]
    ordered = spaces.Dict(OrderedDict([("z", spaces.Discrete(2)), ("a", spaces.Discrete(3))]))
    assert [leaf.path for leaf in space_leaves(ordered)] == [(k,) for k in ordered.keys()]


def test_space_leaves_nested_paths():
    space = spaces.Dict({
        "pos": spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Dict({"v": spaces.Discrete(3), "u": spaces.MultiBinary(2)}))),
        "img": spaces.Box(0, 255, (4, 4), np.uint8),
    })
    leaves = space_leaves(space)
    assert [leaf.path for leaf in leaves] == [("img",), ("pos", 0), ("pos", 1, "u"), ("pos", 1, "v")]
    assert [leaf.field for leaf in leaves] == ["['img']", "['pos'][0]", "['pos'][1]['u']", "['pos'][1]['v']"]
    assert [leaf.space for leaf in leaves] == [space["img"], space["pos"][0], space["pos"][1]["u"], space["pos"][1]["v"]]


@SETTINGS
@given(space=space_trees, seed=seeds)
def test_space_leaves_order_matches_gymnasium(space, seed):
    leaves = space_leaves(space)
    assert [leaf.space for leaf in leaves] == gym_leaf_order(space)
    assert all(leaf.space is get_path(space, leaf.path) for leaf in leaves)
    # gymnasium.spaces.flatten concatenates the leaves in its order: so must ours
    value = sample(space, seed)
    values = flatten(space, value)
    ours = np.concatenate([spaces.flatten(leaf.space, v) for leaf, v in zip(leaves, values)])
    np.testing.assert_array_equal(ours, spaces.flatten(space, value))
    assert spaces.flatdim(space) == sum(spaces.flatdim(leaf.space) for leaf in leaves)


# --- flatten / assemble -------------------------------------------------------------------------


@SETTINGS
@given(space=space_trees, seed=seeds)
@pytest.mark.filterwarnings("ignore:.*Casting input x to numpy array")  # Box.contains of a 0-d sample
def test_flatten_then_assemble_round_trips(space, seed):
    value = sample(space, seed)
    leaves = space_leaves(space)
    values = flatten(space, value)
    assert len(values) == len(leaves)
    for leaf, v in zip(leaves, values):
        assert v is get_path(value, leaf.path)
        assert np.shape(v) == leaf.shape
        assert np.asarray(v).dtype == leaf.dtype
    rebuilt = assemble(space, values)
    assert_same(value, rebuilt)
    assert space.contains(rebuilt)
    assert all(a is b for a, b in zip(flatten(space, rebuilt), values))


@SETTINGS
@given(space=space_trees, num_envs=st.integers(1, 4), seed=seeds)
def test_assemble_batched_leaves(space, num_envs, seed):
    """assemble works on batched leaf arrays too (what a vector env hands back)."""
    leaves = space_leaves(space)
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 2, size=(num_envs, *leaf.shape)).astype(leaf.dtype) for leaf in leaves]
    batched = assemble(space, arrays)
    assert all(a is b for a, b in zip(flatten(space, batched), arrays))
    for leaf, a in zip(leaves, arrays):
        assert get_path(batched, leaf.path) is a


def test_assemble_flat_space_returns_the_array():
    a = np.zeros(3)
    assert assemble(spaces.Box(-1, 1, (3,)), [a]) is a
    assert flatten(spaces.Box(-1, 1, (3,)), a) == [a]


def test_assemble_builds_dicts_and_tuples():
    space = spaces.Tuple((spaces.Discrete(2), spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Tuple((spaces.Discrete(2),))})))
    out = assemble(space, [1, 2, 3])
    assert out == (1, {"a": 2, "b": (3,)})
    assert type(out) is tuple and type(out[1]["b"]) is tuple


# --- pickled leaves -----------------------------------------------------------------------------


PICKLED_SPACES = [
    spaces.Text(8),
    spaces.Sequence(spaces.Box(-1, 1, (2,))),
    spaces.Sequence(spaces.Discrete(3), stack=True),
    spaces.Graph(node_space=spaces.Box(-1, 1, (3,)), edge_space=spaces.Discrete(4)),
    spaces.OneOf((spaces.Discrete(2), spaces.Box(-1, 1, (2,)))),
]


@pytest.mark.parametrize("space", PICKLED_SPACES, ids=lambda s: type(s).__name__)
def test_variable_size_spaces_are_pickled_leaves(space):
    leaves = space_leaves(space)
    assert leaves == [Leaf((), (), PICKLED, space)]
    assert leaves[0].pickled
    assert leaves[0].dtype == np.dtype(object)


def test_custom_space_is_a_pickled_leaf():
    class Custom(spaces.Space):
        pass

    space = spaces.Dict({"c": Custom()})
    (leaf,) = space_leaves(space)
    assert leaf.pickled and leaf.path == ("c",) and leaf.shape == ()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pickled_leaves_round_trip_inside_nested_spaces(seed):
    space = spaces.Dict({
        "txt": spaces.Text(6),
        "obs": spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Sequence(spaces.Discrete(3)))),
        "g": spaces.Graph(node_space=spaces.Box(-1, 1, (2,)), edge_space=None),
    })
    leaves = space_leaves(space)
    assert [leaf.path for leaf in leaves] == [("g",), ("obs", 0), ("obs", 1), ("txt",)]
    assert [leaf.pickled for leaf in leaves] == [True, False, True, True]
    value = sample(space, seed)
    values = flatten(space, value)
    assert values[0] is value["g"] and values[2] is value["obs"][1] and values[3] is value["txt"]
    rebuilt = assemble(space, values)
    assert rebuilt["txt"] is value["txt"] and rebuilt["g"] is value["g"]
    assert rebuilt["obs"][1] is value["obs"][1]
    np.testing.assert_array_equal(rebuilt["obs"][0], value["obs"][0])
    assert space.contains(rebuilt)


# --- Leaf.field / pickled_fields ----------------------------------------------------------------


def test_leaf_field_strings():
    box = spaces.Box(-1, 1, (1,))
    assert Leaf((), (1,), np.dtype(np.float32), box).field == ""
    assert Leaf(("image",), (1,), np.dtype(np.float32), box).field == "['image']"
    assert Leaf((1, "pos"), (1,), np.dtype(np.float32), box).field == "[1]['pos']"
    assert Leaf(("a", 0, "b"), (1,), np.dtype(np.float32), box).field == "['a'][0]['b']"


def test_pickled_fields_names():
    obs = spaces.Dict({"x": spaces.Text(4), "y": spaces.Box(-1, 1, (2,))})
    act = spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(3)),
                        spaces.Dict({"g": spaces.Graph(spaces.Box(-1, 1, (1,)), None)})))
    assert pickled_fields(obs, act) == [
        "observation_space['x'] (Text)",
        "action_space[1] (Sequence)",
        "action_space[2]['g'] (Graph)",
    ]


def test_pickled_fields_flat_spaces():
    assert pickled_fields(spaces.Text(3), spaces.Discrete(2)) == ["observation_space (Text)"]
    assert pickled_fields(spaces.Box(-1, 1, (2,)), spaces.OneOf((spaces.Discrete(2),))) == ["action_space (OneOf)"]


def test_pickled_fields_none():
    obs = spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2)))})
    assert pickled_fields(obs, spaces.MultiDiscrete([2, 2])) == []
