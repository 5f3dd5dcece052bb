"""Split a model into Streaming DiLoCo fragments and schedule when each one syncs.

Douillard et al. 2025, "Streaming DiLoCo with overlapping communication": the model is cut into F
fragments made of *strided* groups of layers (block ``i`` goes to fragment ``i % F``), so each
fragment spans the depth of the network; fragment ``f`` syncs at the steps where
``step % H == offset_f``, with offsets spread evenly over ``H``.

The repeated blocks are found as the largest ``nn.ModuleList`` in the model (``transformer.h``,
``blocks``, ...); without one, each top-level child module holding parameters is a block. Parameters
outside the blocks (token/position embeddings, final norm, head) are placed one tensor at a time,
largest first, into the fragment that is currently smallest, so fragments stay balanced in size and
the peak bytes of a sync stay near ``1/F`` of a full DiLoCo sync.
"""

from __future__ import annotations

import torch

from swarmtrain.core.errors import ConfigError

__all__ = ["find_blocks", "split_fragments", "fragment_offsets"]


def find_blocks(model: torch.nn.Module) -> tuple[str, int]:
    """The qualified name prefix of the repeated blocks and how many there are.

    Returns:
        ``(prefix, count)`` where block ``i``'s parameters are named ``f"{prefix}{i}."...``; the
        prefix is ``""`` when the blocks are the model's top-level children.
    """
    best: tuple[str, int] = ("", 0)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > best[1]:
            if any(True for _ in mod.parameters()):
                best = (f"{name}." if name else "", len(mod))
    return best


def split_fragments(model: torch.nn.Module, fragments: int) -> list[list[str]]:
    """Parameter names of each fragment (every trainable parameter in exactly one fragment).

    Raises:
        ConfigError: ``fragments`` is below 1 or above the number of blocks.
    """
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    prefix, count = find_blocks(model)
    block_of: dict[str, int] = {}
    if count:
        for n in params:
            if n.startswith(prefix):
                head = n[len(prefix) :].split(".", 1)[0]
                if head.isdigit():
                    block_of[n] = int(head)
    else:  # no ModuleList: top-level children with parameters are the blocks
        tops = [c for c, m in model.named_children() if any(True for _ in m.parameters())]
        count = len(tops)
        for n in params:
            top = n.split(".", 1)[0]
            if top in tops:
                block_of[n] = tops.index(top)
    if fragments < 1 or fragments > count:
        raise ConfigError(
            f"strategy.fragments = {fragments} but the model has {count} blocks to split; "
            f"choose 1 <= fragments <= {count}"
        )
    groups: list[list[str]] = [[] for _ in range(fragments)]
    sizes = [0] * fragments
    for n, b in block_of.items():
        groups[b % fragments].append(n)
        sizes[b % fragments] += params[n].numel()
    rest = sorted((n for n in params if n not in block_of), key=lambda n: (-params[n].numel(), n))
    for n in rest:
        f = min(range(fragments), key=lambda i: (sizes[i], i))
        groups[f].append(n)
        sizes[f] += params[n].numel()
    order = list(params)
    return [sorted(g, key=order.index) for g in groups]


def fragment_offsets(inner_steps: int, fragments: int, overlap: int) -> list[int]:
    """Sync offsets ``offset_f = f * H // F``; at most one fragment may be in flight.

    Raises:
        ConfigError: ``fragments > inner_steps`` or an overlap longer than the gap between two
            consecutive fragments' syncs (two fragments would be in flight at once).
    """
    if fragments > inner_steps:
        raise ConfigError(
            f"strategy.fragments = {fragments} exceeds strategy.inner_steps = {inner_steps}: "
            "each fragment needs its own step in every H-step cycle"
        )
    offsets = [f * inner_steps // fragments for f in range(fragments)]
    gaps = [b - a for a, b in zip(offsets, [*offsets[1:], offsets[0] + inner_steps], strict=True)]
    if overlap > min(gaps):
        raise ConfigError(
            f"strategy.overlap = {overlap} is longer than the {min(gaps)} steps between two fragment "
            f"syncs (inner_steps {inner_steps} / fragments {fragments}); at most one fragment may be "
            "in flight"
        )
    return offsets
