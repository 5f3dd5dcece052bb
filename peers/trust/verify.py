"""Replicated-owner check for the butterfly all-reduce, and outlier flags: the pure rules.

A Byzantine partition owner can return any aggregate; no reducer helps, since the reducer runs on the
owner. Defence (a replicated computation, in the spirit of BTARD's verification, Gorbunov et al. 2022,
but without its random probes): every partition ``i`` of a round has a *primary* owner
``members[i]`` and a *verifier* ``members[verifier_index(n, i, round)]``. Senders push their part of
the partition to both; both reduce the same decoded rows in the same (member) order with the same
reducer, so honest ones get bit-identical aggregates; the verifier sends the SHA-256 of its compressed
aggregate chunk to every member; every member compares it with the hash of the bytes the primary sent
*it* (which also catches a primary that sends different bytes to different peers). On a mismatch the
round commits for nobody and both the primary and the verifier are accused. Pairings rotate with the
round number through all ``n - 1`` other members, so a lying owner meets ``f + 1`` distinct verifiers
within ``f + 1`` rounds while an honest peer only ever mismatches with Byzantine partners.

The steps that run this inside a round are in ``peers.rounds.owner_check``; the failure is
``peers.rounds.round_errors.OwnerCheckFailed``.

``outlier_rows`` flags the rows of a partition that point away from the robust aggregate and lie
farther from it than the typical row: the evidence behind outlier suspicion.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["verifier_index", "verified_partition", "chunk_digest", "outlier_rows"]


def verifier_index(n: int, i: int, round_id: int) -> int:
    """Index of the verifier of partition ``i`` in a round of ``n`` members (``-1`` when ``n < 2``).

    Shift ``1 + round_id mod (n - 1)``: never the owner itself, a permutation of the members (each
    member verifies exactly one partition), and over ``n - 1`` consecutive rounds every owner is paired
    with every other member once.
    """
    if n < 2:
        return -1
    return (i + 1 + round_id % (n - 1)) % n


def verified_partition(n: int, me: int, round_id: int) -> int:
    """The partition member ``me`` verifies (inverse of :func:`verifier_index`; ``-1`` when ``n < 2``)."""
    if n < 2:
        return -1
    return (me - 1 - round_id % (n - 1)) % n


def chunk_digest(frame: bytes) -> bytes:
    """SHA-256 of one encoded aggregate chunk (what the verifier sends, 32 bytes)."""
    return hashlib.sha256(frame).digest()


def outlier_rows(stack: torch.Tensor, aggregate: torch.Tensor, ratio: float = 1.5) -> list[int]:
    """Rows of ``stack`` ``[k, m]`` that are outliers with respect to ``aggregate`` ``[m]``.

    A row is flagged when it points away from the aggregate (negative cosine) *and* lies more than
    ``ratio`` times the median row distance from it. Honest rows of a noisy step can fail one of the
    two tests now and then; suspicion only counts rows flagged repeatedly (``peers.trust.suspicion``).
    """
    if stack.dim() != 2 or stack.shape[0] < 3 or stack.shape[1] != aggregate.numel():
        return []
    x = stack.double()
    a = aggregate.double().reshape(1, -1)
    dist = torch.linalg.vector_norm(x - a, dim=1)  # [k]
    med = float(dist.median())
    na = float(torch.linalg.vector_norm(a))
    if na == 0.0 or med == 0.0:
        return []
    cos = (x @ a.T).reshape(-1) / (torch.linalg.vector_norm(x, dim=1).clamp_min(1e-300) * na)  # [k]
    return [j for j in range(x.shape[0]) if float(cos[j]) < 0.0 and float(dist[j]) > ratio * med]
