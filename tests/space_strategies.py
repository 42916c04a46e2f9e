"""Hypothesis strategies for Gymnasium spaces, shared by the unit tests of the lower rooms."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Few examples and no deadline: the suite runs on 2 cores, and the autouse leak check in
# conftest.py is a function-scoped fixture.
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def boxes(draw):
    shape = draw(shapes)
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int16, np.int32, np.int64, np.uint8]))
    low, high = (0, 9) if np.issubdtype(dtype, np.integer) else (-2.0, 2.0)
    return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)


leaf_spaces = st.one_of(
    boxes(),
    st.builds(spaces.Discrete, st.integers(1, 10), start=st.integers(-3, 3)),
    st.lists(st.integers(2, 5), min_size=1, max_size=3).map(lambda n: spaces.MultiDiscrete(n)),
    st.integers(1, 6).map(spaces.MultiBinary),
    st.lists(st.integers(1, 3), min_size=2, max_size=2).map(lambda s: spaces.MultiBinary(s)),
)

keys = st.text(alphabet="abcdxyz", min_size=1, max_size=3)


def space_trees(depth: int):
    """A leaf, or a Dict / Tuple of nested spaces, at most ``depth`` containers deep."""
    if depth == 0:
        return leaf_spaces
    sub = space_trees(depth - 1)
    return st.one_of(
        leaf_spaces,
        st.lists(sub, min_size=1, max_size=3).map(lambda s: spaces.Tuple(s)),
        st.dictionaries(keys, sub, min_size=1, max_size=3).map(lambda d: spaces.Dict(d)),
    )
