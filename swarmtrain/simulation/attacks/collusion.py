"""Collusion among real attacking peers: how ALIE and IPM run without omniscience.

ALIE (Baruch et al. 2019) and IPM (Xie et al. 2020) are defined with the honest peers' updates in
hand. A real attacker never sees those: the butterfly all-reduce gives each peer only the partitions
it owns, after the round. What colluding attackers *can* know is their own honest updates (each
computes one on its own data shard, drawn from the same distribution as the honest peers' data). So
before every round the attackers all-gather their honest updates among themselves, over a side
channel the honest peers do not take part in (a second ``P2PCollective`` of the attackers' nodes in
its own rounds namespace), and use those ``K`` rows as their estimate of the honest updates: ALIE's
mean and standard deviation, IPM's mean. With ``K = 1`` the estimate is the attacker's own update
alone (ALIE's standard deviation is then 0 and it sends its own update; IPM sends
``-epsilon * own``). The estimate's error shrinks like ``1/sqrt(K)``; the papers' attacks are the
limit of exact knowledge.

Payload (our own, msgpack): ``{"v": 1, "t": [[name, packet], ...]}``, one ``swarmtrain.core.wire`` packet
of codec ``"none"`` (fp32) per tensor, in the sender's key order. Colluders are attackers, but the
decoder still trusts nothing: a bounded unpack, names and sizes checked against this peer's own
tensors, finite values only; a bad payload is left out of the estimate (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgpack
import numpy as np
import torch

from swarmtrain.core.errors import ProtocolError, SwarmError
from swarmtrain.core.packet import Packet
from swarmtrain.core.protocols import Collective
from swarmtrain.core.safe_msgpack import unpack
from swarmtrain.core.wire import decode_packet, encode_packet

__all__ = ["Colluders", "encode_rows", "decode_rows"]

log = logging.getLogger(__name__)

VERSION = 1
_OVERHEAD = 256  # msgpack framing per tensor, generously


def encode_rows(rows: Mapping[str, torch.Tensor]) -> bytes:
    """Pack flat tensors ``name -> [m]`` as fp32 ``"none"`` packets, in the mapping's order."""
    entries = []
    for name, t in rows.items():
        arr = t.detach().reshape(-1).to(torch.float32).cpu().contiguous().numpy().astype("<f4")
        entries.append([name, encode_packet(Packet("none", (int(arr.size),), "float32", (arr.tobytes(),)))])
    out: bytes = msgpack.packb({"v": VERSION, "t": entries}, use_bin_type=True)
    return out


def decode_rows(data: bytes, expect: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Unpack ``encode_rows`` output; ``expect`` maps each name, in order, to its element count.

    Raises:
        ProtocolError: anything malformed, oversized, of the wrong names or sizes, or non-finite.
    """
    limit = sum(4 * m + _OVERHEAD + len(n) for n, m in expect.items()) + 64
    if not isinstance(data, bytes | bytearray) or len(data) > limit:
        raise ProtocolError(f"collusion payload exceeds the bound of {limit} bytes")
    obj = unpack(
        data,
        what="collusion payload",
        max_bytes=limit,
        max_str=1024,
        max_bin=limit,
        max_array=max(2, len(expect)),
        max_map=2,
    )
    if not isinstance(obj, dict) or set(obj) != {"v", "t"} or obj["v"] != VERSION:
        raise ProtocolError("collusion payload: expected {v: 1, t: [...]}")
    entries = obj["t"]
    if not isinstance(entries, list) or len(entries) != len(expect):
        raise ProtocolError(f"collusion payload: expected {len(expect)} tensors")
    out: dict[str, torch.Tensor] = {}
    for entry, (name, m) in zip(entries, expect.items(), strict=True):
        ok = isinstance(entry, list) and len(entry) == 2 and entry[0] == name
        if not ok or not isinstance(entry[1], bytes):
            raise ProtocolError(f"collusion payload: expected tensor {name!r}")
        p = decode_packet(entry[1], max_numel=m, max_bytes=4 * m + _OVERHEAD, codecs=("none",))
        fp32 = p.dtype == "float32" and tuple(p.shape) == (m,) and len(p.buffers) == 1
        if not fp32 or len(p.buffers[0]) != 4 * m:
            raise ProtocolError(f"collusion payload: tensor {name!r} is not {m} fp32 values")
        arr = np.frombuffer(p.buffers[0], dtype="<f4").astype(np.float32)
        if not bool(np.isfinite(arr).all()):
            raise ProtocolError(f"collusion payload: tensor {name!r} holds non-finite values")
        out[name] = torch.from_numpy(arr)
    return out


class Colluders:
    """The attackers' side channel: share honest updates, get back every colluder's.

    Args:
        channel: a collective joined by the attacking peers only (``None``: a colluding group of one).
        timeout: seconds for one exchange; it runs just before the real round, so keep it short.
    """

    def __init__(self, channel: Collective | None, timeout: float = 10.0) -> None:
        self.channel = channel
        self.timeout = timeout
        self.exchanges = 0
        self.failed = 0

    def share(self, own: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every colluder's flat update per name: ``name -> [k, m]`` (this peer's own row included).

        Falls back to this peer's row alone when the exchange fails; never raises for a colluder's
        fault.
        """
        flat = {n: t.detach().reshape(-1).to(torch.float32).cpu() for n, t in own.items()}
        rows: list[dict[str, torch.Tensor]] = []
        if self.channel is not None:
            self.exchanges += 1
            try:
                res = self.channel.all_gather(encode_rows(flat), timeout=self.timeout, kind="collude")
            except SwarmError as e:
                res = None
                log.warning("collusion exchange failed: %s", e)
            if res is not None and res.committed:
                expect = {n: t.numel() for n, t in flat.items()}
                for peer in sorted(res.payloads):
                    if peer == self.channel.peer_id:
                        continue
                    try:
                        rows.append(decode_rows(res.payloads[peer], expect))
                    except ProtocolError as e:
                        log.warning("collusion: leaving out the payload of %s: %s", peer[:12], e)
            else:
                self.failed += 1
        return {n: torch.stack([t, *(r[n] for r in rows)]) for n, t in flat.items()}

    def close(self) -> None:
        """Close the side channel (if it can be closed)."""
        close = getattr(self.channel, "close", None)
        if callable(close):
            close()
