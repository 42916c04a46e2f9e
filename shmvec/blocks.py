"""Envs in contiguous blocks: one block per worker (``ShmVecEnv``) or per Ray actor (``RayVecEnv``)."""

from __future__ import annotations

from typing import Any

from shmvec.protocol import ResetPayload, SetAttrPayload

__all__ = ["reset_payloads", "set_attr_payloads", "split"]


def split(num_envs: int, num_blocks: int) -> list[range]:
    """Contiguous, as-even-as-possible blocks of env indices; the larger ones first."""
    base, extra = divmod(num_envs, num_blocks)
    out, start = [], 0
    for i in range(num_blocks):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def set_attr_payloads(name: str, values: Any, blocks: list[range]) -> list[SetAttrPayload]:
    """``set_attr(name, values)`` as one ``(name, values of the block)`` per block: ``values``
    is one value for every env, or a list/tuple of one per env.
    """
    num_envs = blocks[-1].stop
    if not isinstance(values, (list, tuple)):
        values = [values] * num_envs
    if len(values) != num_envs:
        raise ValueError(f"set_attr({name!r}) got {len(values)} values, expected one per env ({num_envs})")
    return [(name, list(values[b.start : b.stop])) for b in blocks]


def reset_payloads(
    seeds: list | None, options: dict | None, mask: Any, blocks: list[range]
) -> list[ResetPayload] | None:
    """A reset's ``(seeds, options, reset_mask)`` per block (each sliced to the block's envs), or
    ``None`` when there is nothing to pass (a plain ``reset()``).
    """
    if seeds is None and options is None and mask is None:
        return None
    return [
        (None if seeds is None else seeds[b.start : b.stop], options, None if mask is None else mask[b.start : b.stop])
        for b in blocks
    ]
