"""Suspicion: signed accusation records and the ban rule.

Each peer keeps an :class:`AccusationTable` of what *it* saw: owner-check failures (round, primary,
verifier) and, per sender, in how many rounds its rows were outliers out of how many it was seen in.
It publishes the table in the DHT under ``"<run>.suspicion"`` (subkey: its peer ID), signed with its
libp2p identity key (RSA, the key behind its peer ID): a reader checks that the embedded public key
hashes to the claimed peer ID and that the signature holds, so nobody can accuse in another peer's
name. (The DHT stores without checking; a Byzantine node can hide a record until it is re-published,
never forge one.)

Ban rule (:func:`compute_bans`), with ``f`` the tolerated Byzantine peers, built so that at most ``f``
lying accusers can never ban an honest peer on their own:

* *owner*: a failed check ``(round, primary, verifier)`` counts when reported by ``>= f + 1``
  distinct accusers (at least one honest: it happened). One of the pair lied. A peer is banned once
  it was in counted failures with ``>= f + 1`` distinct partners: an honest peer only fails with
  Byzantine partners, of which there are at most ``f``.
* *outlier*: a peer is banned when ``>= f + 1`` distinct accusers each flagged it in at least
  ``strikes`` rounds and in at least ``min_ratio`` of the rounds they saw it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgpack

from peers.keys.signing import Signer, verify_signed_by
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "AccusationTable",
    "encode_signed",
    "decode_signed",
    "decode_table",
    "compute_bans",
    "suspicion_key",
    "MAX_SUSPICION_BYTES",
]

logger = logging.getLogger(__name__)
MAX_SUSPICION_BYTES = 64 * 1024
_MAX_EVENTS = 256
_MAX_PEERS = 1024


def suspicion_key(run_id: str) -> str:
    """DHT key of the run's accusation records."""
    return f"{run_id}.suspicion"


@dataclass
class AccusationTable:
    """What one peer saw (the payload of its signed record).

    Attributes:
        owner_failures: ``(round, primary, verifier)`` of failed owner checks (latest kept).
        outliers: peer -> ``[rounds flagged, rounds seen]``.
    """

    owner_failures: list[tuple[int, str, str]] = field(default_factory=list)
    outliers: dict[str, list[int]] = field(default_factory=dict)

    def add_owner_failure(self, round_id: int, primary: str, verifier: str) -> None:
        """Record a failed check (bounded: the oldest events go first)."""
        ev = (int(round_id), primary, verifier)
        if ev not in self.owner_failures:
            self.owner_failures.append(ev)
            del self.owner_failures[:-_MAX_EVENTS]

    def observe(self, peer: str, flagged: bool) -> None:
        """Count one round in which ``peer``'s rows were seen (and whether they were outliers)."""
        c = self.outliers.setdefault(peer, [0, 0])
        c[0] += int(flagged)
        c[1] += 1

    def to_obj(self) -> dict[str, Any]:
        """Plain data for msgpack."""
        return {
            "o": [list(e) for e in self.owner_failures],
            "x": {k: list(v) for k, v in self.outliers.items()},
        }

    @classmethod
    def from_obj(cls, obj: Any) -> AccusationTable:
        """Validate plain data from a peer.

        Raises:
            ProtocolError: ill-typed or oversized.
        """
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("o"), list)
            or not isinstance(obj.get("x"), dict)
        ):
            raise ProtocolError("accusation table malformed")
        if len(obj["o"]) > _MAX_EVENTS or len(obj["x"]) > _MAX_PEERS:
            raise ProtocolError("accusation table too large")
        t = cls()
        for e in obj["o"]:
            if not (
                isinstance(e, list) and len(e) == 3 and isinstance(e[0], int) and not isinstance(e[0], bool)
            ):
                raise ProtocolError("owner failure malformed")
            if not (
                isinstance(e[1], str)
                and isinstance(e[2], str)
                and 0 < len(e[1]) <= 128
                and 0 < len(e[2]) <= 128
            ):
                raise ProtocolError("owner failure malformed")
            t.owner_failures.append((e[0], e[1], e[2]))
        for k, v in obj["x"].items():
            if not (isinstance(k, str) and 0 < len(k) <= 128 and isinstance(v, list) and len(v) == 2):
                raise ProtocolError("outlier count malformed")
            if (
                not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 40 for c in v)
                or v[0] > v[1]
            ):
                raise ProtocolError("outlier count malformed")
            t.outliers[k] = [v[0], v[1]]
        return t


def _signed_bytes(run_id: str, accuser: str, body: bytes) -> bytes:
    return b"swarmtrain-suspicion\0" + run_id.encode() + b"\0" + accuser.encode() + b"\0" + body


def encode_signed(run_id: str, table: AccusationTable, signer: Signer) -> bytes:
    """The DHT value of ``signer``'s record: msgpack ``{a, k, b, s}`` (accuser, key, body, signature)."""
    body = bytes(msgpack.packb(table.to_obj(), use_bin_type=True))
    sig = signer.sign(_signed_bytes(run_id, signer.peer_id, body))
    out = bytes(
        msgpack.packb({"a": signer.peer_id, "k": signer.public_der, "b": body, "s": sig}, use_bin_type=True)
    )
    if len(out) > MAX_SUSPICION_BYTES:
        raise ProtocolError("suspicion record too large")
    return out


def decode_signed(run_id: str, subkey: str, value: Any) -> AccusationTable:
    """Verify and parse one record read from the DHT under ``subkey``.

    Raises:
        ProtocolError: malformed, oversized, signed by a key that is not ``subkey``'s, or a bad signature.
    """
    if not isinstance(value, bytes) or len(value) > MAX_SUSPICION_BYTES:
        raise ProtocolError("suspicion record is not bytes or too large")
    obj = unpack(
        value,
        what="suspicion record",
        max_bytes=MAX_SUSPICION_BYTES,
        max_str=256,
        max_bin=MAX_SUSPICION_BYTES,
        max_array=MAX_SUSPICION_BYTES,  # the record has no arrays; its length bounds any
        max_map=8,
    )
    if not isinstance(obj, dict) or not all(
        isinstance(obj.get(k), t) for k, t in (("a", str), ("k", bytes), ("b", bytes), ("s", bytes))
    ):
        raise ProtocolError("suspicion record fields missing or ill-typed")
    if obj["a"] != subkey:
        raise ProtocolError("suspicion record stored under another peer's subkey")
    verify_signed_by(subkey, obj["k"], _signed_bytes(run_id, subkey, obj["b"]), obj["s"])
    return decode_table(obj["b"])


def decode_table(body: bytes) -> AccusationTable:
    """Parse the signed body of a suspicion record (after its signature was checked).

    Raises:
        ProtocolError: not bounded msgpack, or not a valid accusation table.
    """
    obj = unpack(
        body,
        what="suspicion body",
        max_bytes=MAX_SUSPICION_BYTES,
        max_str=256,
        max_bin=MAX_SUSPICION_BYTES,  # the table has no byte strings; its length bounds any
        max_array=_MAX_PEERS,
        max_map=_MAX_PEERS,
    )
    return AccusationTable.from_obj(obj)


def compute_bans(
    tables: dict[str, AccusationTable], f: int, *, strikes: int = 3, min_ratio: float = 0.5
) -> dict[str, str]:
    """Banned peer -> reason, from verified tables (accuser -> table). See the module docstring.

    A peer's accusations against itself are ignored. Deterministic for a given set of tables.
    """
    if f < 0 or strikes < 1 or not 0.0 <= min_ratio <= 1.0:
        raise ConfigError("compute_bans: need f >= 0, strikes >= 1, 0 <= min_ratio <= 1")
    need = f + 1
    reporters: dict[tuple[int, str, str], set[str]] = defaultdict(set)
    for accuser, t in tables.items():
        for r, primary, verifier in t.owner_failures:
            if primary != verifier:
                reporters[(r, primary, verifier)].add(accuser)
    partners: dict[str, set[str]] = defaultdict(set)
    rounds: dict[str, set[int]] = defaultdict(set)
    for (r, primary, verifier), who in reporters.items():
        if len(who) >= need:
            for a, b in ((primary, verifier), (verifier, primary)):
                partners[a].add(b)
                rounds[a].add(r)
    bans: dict[str, str] = {}
    for peer in sorted(partners):
        if len(partners[peer]) >= need:
            bans[peer] = (
                f"owner check failed with {len(partners[peer])} distinct partners "
                f"in {len(rounds[peer])} rounds (>= {need} accusers each)"
            )
    flaggers: dict[str, list[str]] = defaultdict(list)
    for accuser, t in tables.items():
        for peer, (flagged, seen) in t.outliers.items():
            if peer != accuser and flagged >= strikes and flagged >= min_ratio * seen:
                flaggers[peer].append(accuser)
    for peer in sorted(flaggers):
        if len(flaggers[peer]) >= need and peer not in bans:
            bans[peer] = f"outlier updates, flagged by {len(flaggers[peer])} peers (>= {strikes} rounds each)"
    return bans
