"""The usage examples in the public docstrings run as written."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["shmvec", "shmvec.vector_env", "shmvec.make_vec", "shmvec.rollout",
                                    "shmvec.advantage", "shmvec.torch", "shmvec.baselines", "shmvec.pettingzoo",
                                    "shmvec.sb3"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
