"""Unit tests for shmvec.blocks: envs in contiguous blocks, and per-block payloads."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmvec.blocks import reset_payloads, set_attr_payloads, split

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# --- split --------------------------------------------------------------------------------------


@SETTINGS
@given(num_envs=st.integers(0, 300), num_blocks=st.integers(1, 40))
def test_split_properties(num_envs, num_blocks):
    blocks = split(num_envs, num_blocks)
    assert len(blocks) == num_blocks
    assert all(isinstance(b, range) and b.step == 1 for b in blocks)
    # contiguous and covering 0..num_envs exactly
    assert blocks[0].start == 0
    assert blocks[-1].stop == num_envs
    for a, b in zip(blocks, blocks[1:]):
        assert a.stop == b.start
    assert [i for b in blocks for i in b] == list(range(num_envs))
    # as even as possible, the larger ones first
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == num_envs


@pytest.mark.parametrize("num_envs, num_blocks, expected", [
    (8, 4, [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]),
    (7, 3, [range(0, 3), range(3, 5), range(5, 7)]),
    (5, 1, [range(0, 5)]),
    (2, 3, [range(0, 1), range(1, 2), range(2, 2)]),
])
def test_split_examples(num_envs, num_blocks, expected):
    assert split(num_envs, num_blocks) == expected


# --- set_attr_payloads --------------------------------------------------------------------------


def test_set_attr_one_value_for_all():
    blocks = split(5, 2)
    value = {"shared": True}
    payloads = set_attr_payloads("cfg", value, blocks)
    assert payloads == [("cfg", [value] * 3), ("cfg", [value] * 2)]
    assert all(v is value for _, vs in payloads for v in vs)


def test_set_attr_string_is_one_value_not_a_sequence():
    payloads = set_attr_payloads("mode", "abc", split(3, 3))
    assert payloads == [("mode", ["abc"])] * 3


def test_set_attr_one_per_env_list_and_tuple():
    blocks = split(5, 2)
    assert set_attr_payloads("speed", [0, 1, 2, 3, 4], blocks) == [("speed", [0, 1, 2]), ("speed", [3, 4])]
    out = set_attr_payloads("speed", (0, 1, 2, 3, 4), blocks)
    assert out == [("speed", [0, 1, 2]), ("speed", [3, 4])]
    assert all(type(vs) is list for _, vs in out)


def test_set_attr_one_per_env_with_empty_blocks():
    assert set_attr_payloads("x", ["a", "b"], split(2, 3)) == [("x", ["a"]), ("x", ["b"]), ("x", [])]


@pytest.mark.parametrize("values", [[1, 2, 3], (1, 2, 3, 4, 5), []])
def test_set_attr_wrong_length(values):
    msg = f"set_attr('speed') got {len(values)} values, expected one per env (4)"
    with pytest.raises(ValueError, match=re.escape(msg)):
        set_attr_payloads("speed", values, split(4, 2))


# --- reset_payloads -----------------------------------------------------------------------------


def test_reset_payloads_none_when_nothing_to_pass():
    assert reset_payloads(None, None, None, split(4, 2)) is None


def test_reset_payloads_seeds_only():
    assert reset_payloads([10, 11, 12, 13, 14], None, None, split(5, 2)) == [
        ([10, 11, 12], None, None),
        ([13, 14], None, None),
    ]


def test_reset_payloads_options_only_are_shared():
    options = {"difficulty": 3}
    payloads = reset_payloads(None, options, None, split(4, 3))
    assert payloads == [(None, options, None)] * 3
    assert all(p[1] is options for p in payloads)


def test_reset_payloads_mask_only():
    mask = np.array([True, False, True, True, False])
    payloads = reset_payloads(None, None, mask, split(5, 2))
    assert len(payloads) == 2
    assert payloads[0][:2] == (None, None) and payloads[1][:2] == (None, None)
    np.testing.assert_array_equal(payloads[0][2], [True, False, True])
    np.testing.assert_array_equal(payloads[1][2], [True, False])


def test_reset_payloads_everything():
    seeds = [1, None, 3, 4, 5, 6, 7]
    mask = np.array([True, True, False, True, False, True, True])
    options = {"a": 1}
    blocks = split(7, 3)
    payloads = reset_payloads(seeds, options, mask, blocks)
    assert len(payloads) == len(blocks)
    for (s, o, m), b in zip(payloads, blocks):
        assert s == seeds[b.start:b.stop]
        assert o is options
        np.testing.assert_array_equal(m, mask[b.start:b.stop])
    assert [p[0] for p in payloads] == [[1, None, 3], [4, 5], [6, 7]]


@SETTINGS
@given(num_envs=st.integers(1, 40), num_blocks=st.integers(1, 10), data=st.data())
def test_reset_payloads_slices_cover_everything(num_envs, num_blocks, data):
    blocks = split(num_envs, num_blocks)
    seeds = data.draw(st.lists(st.integers(0, 1000), min_size=num_envs, max_size=num_envs))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)))
    payloads = reset_payloads(seeds, None, mask, blocks)
    assert [x for s, _, _ in payloads for x in s] == seeds
    np.testing.assert_array_equal(np.concatenate([m for _, _, m in payloads]), mask)
