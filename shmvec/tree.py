"""Space trees: a (possibly nested) Gymnasium space as a flat list of leaves, and back.

A Dict or Tuple space is opened into its leaves in Gymnasium's order; samples are flattened
into one value per leaf (:func:`flatten`) and rebuilt from them (:func:`assemble`). Leaves
whose samples have no fixed size (Text, Sequence, Graph, OneOf, custom spaces) are *pickled
leaves*: one Python object per env. ``layout`` gives each leaf its bytes in the segment.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

PICKLED = np.dtype(object)  # the dtype of a pickled leaf and of its (private) regions


@dataclass(frozen=True)
class Leaf:
    """One array of a (possibly nested) space: ``path`` indexes into the sample.

    A fixed-size leaf has its sample's shape and dtype; a pickled leaf (a sample of no fixed
    size) has shape ``()`` and dtype ``object``: one Python object per env.
    """

    path: tuple[Any, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    space: spaces.Space

    @property
    def field(self) -> str:
        """The leaf's place in a sample, e.g. ``['image']`` (empty for a flat space)."""
        return "".join(f"[{p!r}]" for p in self.path)

    @property
    def pickled(self) -> bool:
        """Whether the leaf's samples travel pickled rather than in shared memory."""
        return self.dtype == PICKLED


def space_leaves(space: spaces.Space, path: tuple[Any, ...] = ()) -> list[Leaf]:
    """Flatten ``space`` into leaves, in the order Gymnasium iterates them.

    Box, Discrete, MultiDiscrete and MultiBinary are fixed-size leaves; Dict and Tuple are
    opened; any other space (Text, Sequence, Graph, OneOf, a custom space) is one pickled leaf,
    as Gymnasium's ``batch_space`` treats it as one item per env.
    """
    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        return [Leaf(path, tuple(space.shape or ()), np.dtype(space.dtype), space)]
    if isinstance(space, spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in space_leaves(sub, path + (key,))]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in space_leaves(sub, path + (i,))]
    return [Leaf(path, (), PICKLED, space)]


def pickled_fields(observation_space: spaces.Space, action_space: spaces.Space) -> list[str]:
    """The pickled leaves of the two spaces, named for messages: ``["observation_space['x'] (Text)"]``."""
    return [
        f"{what}{leaf.field} ({type(leaf.space).__name__})"
        for what, space in (("observation_space", observation_space), ("action_space", action_space))
        for leaf in space_leaves(space)
        if leaf.pickled
    ]


def assemble(space: spaces.Space | None, arrays: list[Any]) -> Any:
    """Rebuild the nested structure of ``space`` (dict / tuple) around leaf arrays.

    ``arrays`` is in :func:`space_leaves` order (of any type: numpy arrays, tensors, views); a
    space that is not a Dict or Tuple, or ``None``, has one leaf: ``arrays[0]``.
    """
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        return arrays[0]
    return _assemble(space, iter(arrays))


def _assemble(space: spaces.Space, leaves: Iterator[Any]) -> Any:
    # A module-level function, not a closure that calls itself: such a closure is a reference
    # cycle, which kept every batch it built alive until the garbage collector ran (memory
    # swinging, and a page fault per page of each new batch).
    if isinstance(space, spaces.Dict):
        return {key: _assemble(sub, leaves) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_assemble(sub, leaves) for sub in space.spaces)
    return next(leaves)


def flatten(space: spaces.Space | None, value: Any) -> list[Any]:
    """The leaves of a nested sample or batch, in :func:`space_leaves` order (the inverse of
    :func:`assemble`); a space that is not a Dict or Tuple, or ``None``, gives ``[value]``.
    """
    if isinstance(space, spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in flatten(sub, value[key])]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in flatten(sub, value[i])]
    return [value]
