"""Split a model into Streaming DiLoCo fragments and schedule when each one syncs.

Douillard et al. 2025, "Streaming DiLoCo with overlapping communication": the model is cut into F
fragments made of *strided* groups of layers (block ``i`` goes to fragment ``i % F``), so each
fragment spans the depth of the network; fragment ``f`` syncs at the steps where
``step % H == offset_f``, with offsets spread evenly over ``H``.

The repeated blocks are found as the largest ``nn.ModuleList`` in the model (``transformer.h``,
``blocks``, ...); without one, each top-level child module holding parameters is a block. Parameters
outside the blocks (token/position embeddings, final norm, head) are placed one tensor at a time,
largest first, into the fragment that is currently smallest.

Balance. The point of fragments is that a sync carries ``1/F`` of the model, but whole tensors rarely
divide evenly: the tiny GPT's token embedding beside block 0 made one fragment 0.274 of the model with
F = 4, and 6 blocks in 4 fragments put two blocks in some. So fragments are made of *pieces*, flat
element ranges ``[lo, hi)`` of a parameter, and after the placement above every fragment larger than
``cap = ceil(total / F)`` hands the tail of its largest piece (embeddings and other non-block tensors
first) to the currently smallest fragment until none exceeds ``cap``. Every fragment then holds at
most ``ceil(total / F)`` elements (the least possible), at most ``2F`` tensors are cut, and blocks
keep their strided fragment unless the blocks alone overflow it. A piece is named by its parameter
name when it is the whole tensor (so balanced models keep the plain names) and ``name[lo:hi]``
otherwise; ``piece_range`` reads such a key back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from swarmtrain.core.errors import ConfigError

__all__ = ["find_blocks", "split_fragments", "piece_range", "piece_key", "fragment_offsets"]


def piece_key(name: str, lo: int, hi: int, numel: int) -> str:
    """The key of elements ``[lo, hi)`` of parameter ``name`` (``name`` itself for the whole tensor)."""
    return name if lo == 0 and hi == numel else f"{name}[{lo}:{hi}]"


def piece_range(key: str, numels: Mapping[str, int]) -> tuple[str, int, int]:
    """``(name, lo, hi)`` of a piece key (``split_fragments``); ``numels`` maps names to sizes.

    Raises:
        ConfigError: a key that names no parameter or a range outside it.
    """
    if key in numels:
        return key, 0, numels[key]
    name, bracket, rest = key.rpartition("[")
    if bracket and rest.endswith("]") and name in numels:
        lo_s, colon, hi_s = rest[:-1].partition(":")
        if colon and lo_s.isdigit() and hi_s.isdigit():
            lo, hi = int(lo_s), int(hi_s)
            if 0 <= lo < hi <= numels[name]:
                return name, lo, hi
    raise ConfigError(f"fragment piece {key[:80]!r} is not a parameter or a range of one")


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
    """Piece keys of each fragment: every element of every trainable parameter in exactly one
    fragment, no fragment above ``ceil(total / fragments)`` elements (see the module docstring).

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
    numels = {n: p.numel() for n, p in params.items()}
    pieces = _balance(groups, numels, set(block_of))
    order = {n: i for i, n in enumerate(params)}
    out = []
    for g in pieces:
        g = sorted(g, key=lambda x: (order[x[0]], x[1]))
        out.append([piece_key(n, lo, hi, numels[n]) for n, lo, hi in _merge(g)])
    return out


Piece = tuple[str, int, int]


def _balance(groups: list[list[str]], numels: Mapping[str, int], in_blocks: set[str]) -> list[list[Piece]]:
    """Cut pieces off the fragments above ``ceil(total / F)`` into the smallest ones (module docstring).

    Each move fills the smallest fragment to the cap, brings the largest down to it, or moves a whole
    piece, so the loop ends after at most a few moves per fragment.
    """
    pieces: list[list[Piece]] = [[(n, 0, numels[n]) for n in g] for g in groups]
    sizes = [sum(hi - lo for _, lo, hi in g) for g in pieces]
    cap = math.ceil(sum(sizes) / len(sizes))
    while True:
        src = max(range(len(sizes)), key=lambda i: (sizes[i], -i))
        if sizes[src] <= cap:
            return pieces
        dst = min(range(len(sizes)), key=lambda i: (sizes[i], i))
        # non-block tensors go first (blocks keep their strided home), the largest piece first
        # (one cut instead of many), ties by name so every peer cuts the same way
        i = max(
            range(len(pieces[src])),
            key=lambda j: (
                pieces[src][j][0] not in in_blocks,
                pieces[src][j][2] - pieces[src][j][1],
                pieces[src][j][0],
            ),
        )
        name, lo, hi = pieces[src][i]
        m = min(sizes[src] - cap, cap - sizes[dst], hi - lo)
        if m == hi - lo:
            pieces[src].pop(i)
        else:
            pieces[src][i] = (name, lo, hi - m)
        pieces[dst].append((name, hi - m, hi))
        sizes[src] -= m
        sizes[dst] += m


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Sorted pieces with adjacent ranges of one tensor joined."""
    out: list[Piece] = []
    for name, lo, hi in pieces:
        if out and out[-1][0] == name and out[-1][2] == lo:
            out[-1] = (name, out[-1][1], hi)
        else:
            out.append((name, lo, hi))
    return out


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
