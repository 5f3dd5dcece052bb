"""Doctor checks against a live run: join its DHT as a monitor, then measure RTT and bandwidth to a
few of its live peers through their probe handlers (``peers.dht.probe``)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from swarmtrain.app.doctor.local import human_rate
from swarmtrain.app.doctor.result import Check, Status

__all__ = ["RunLinks", "check_run", "probe_failure"]


@dataclass
class RunLinks:
    """What the network checks found.

    Attributes:
        checks: ``dht`` first, then one per probed peer.
        peer_throughput: the live trainers' published tokens/s (for the verdict's "slow").
    """

    checks: list[Check] = field(default_factory=list)
    peer_throughput: list[float] = field(default_factory=list)


def probe_failure(e: BaseException, admission: str, has_token: bool, timeout: float) -> str:
    """Why a probe failed, in words: not admitted, unreachable, or timed out."""
    from swarmtrain.core.errors import PeerTimeoutError, ProtocolError

    if isinstance(e, PeerTimeoutError):
        return f"timed out: no answer within {timeout:.0f} s (a firewall or NAT between us?)"
    if isinstance(e, ProtocolError):  # the peer's handler closed the stream: it refuses this node
        if admission != "open" and not has_token:
            return f"not admitted: run admits by {admission}; pass --identity and --token as for join"
        return f"refused the probe (closed the stream; not admitted yet?): {e}"
    return f"unreachable: {e}"


def _probe_check(node: Any, peer_id: str, role: str, download: int, timeout: float, token: bool) -> Check:
    from peers.dht.probe import probe_peer
    from swarmtrain.core.errors import SwarmError

    name = f"peer {peer_id[-8:]}"
    try:
        r = probe_peer(node, peer_id, download_bytes=download, timeout=timeout)
    except SwarmError as e:
        why = probe_failure(e, node.admission.policy, token, timeout)
        return Check(
            name, "warn", "-", f"{role}: probe failed: {why}"[:200], {"peer_id": peer_id, "role": role}
        )
    return Check(
        name,
        "ok",
        f"{r.rtt_s * 1e3:.1f} ms",
        f"{role}: {len(r.rtts_s)} pings; {r.downloaded / (1 << 20):.0f} MiB at "
        f"{human_rate(r.bandwidth_bps, 'B/s')}",
        {
            "peer_id": peer_id,
            "role": role,
            "rtt_s": r.rtt_s,
            "bandwidth_bps": r.bandwidth_bps,
            "downloaded": r.downloaded,
        },
    )


def _live_others(node: Any, published: bool, timeout: float) -> list[Any]:
    """The run's live records but this node's own; with ``published``, first wait (up to ``timeout``)
    until its own record is readable, so the peers it probes have admitted it."""
    deadline = time.monotonic() + timeout
    while True:
        records = node.live_peers(timeout=timeout)
        if not published or any(r.peer_id == node.peer_id for r in records) or time.monotonic() > deadline:
            return [r for r in records if r.peer_id != node.peer_id]
        time.sleep(0.5)


def check_run(cfg: Any, *, n_peers: int, timeout: float, download: int = 1 << 20) -> RunLinks:
    """Join the run's DHT (``cfg``: ``PeersConfig``) as a read-only monitor and probe up to
    ``n_peers`` live peers (trainers first)."""
    from peers.dht.node import PeerNode
    from swarmtrain.core.errors import SwarmError

    out = RunLinks()
    t0 = time.perf_counter()
    publish = bool(cfg.token)  # under token, peers answer only nodes whose signed record they read
    try:
        node = PeerNode(cfg, role="doctor", client_mode=True, publish_record=publish, startup_timeout=timeout)
    except SwarmError as e:  # ConfigError too: a token the run does not accept
        out.checks.append(Check("dht", "fail", "-", f"could not join the run's DHT: {e}"[:200]))
        return out
    with node:
        joined = time.perf_counter() - t0
        try:
            records = _live_others(node, publish, timeout)
        except SwarmError as e:
            out.checks.append(Check("dht", "fail", f"{joined:.2f} s", f"the DHT did not answer: {e}"[:200]))
            return out
        live = len(records)
        status: Status = "ok" if live else "warn"
        detail = f"joined; {live} live peer(s) of run {cfg.run_id!r}"
        out.checks.append(
            Check("dht", status, f"{joined:.2f} s", detail, {"join_s": joined, "live_peers": live})
        )
        out.peer_throughput = [
            r.throughput
            for r in records
            if r.role == "trainer" and math.isfinite(r.throughput) and r.throughput > 0
        ]
        ranked = sorted(records, key=lambda r: (r.role != "trainer", r.peer_id))
        for rec in ranked[:n_peers]:
            out.checks.append(_probe_check(node, rec.peer_id, rec.role, download, timeout, publish))
    probed = out.checks[1:]
    if probed and all(c.status != "ok" for c in probed):
        out.checks.append(Check("peers", "fail", "0 ok", "no live peer answered a probe"))
    elif probed:
        rtts = [v for c in probed if isinstance(v := c.data.get("rtt_s"), float)]
        bws = [v for c in probed if isinstance(v := c.data.get("bandwidth_bps"), float)]
        out.checks.append(
            Check(
                "peers",
                "ok",
                f"{len(rtts)}/{len(probed)} ok",
                f"median rtt {statistics.median(rtts) * 1e3:.1f} ms, "
                f"bandwidth {human_rate(statistics.median(bws), 'B/s')}",
                {
                    "probed": len(probed),
                    "answered": len(rtts),
                    "rtt_s": statistics.median(rtts),
                    "bandwidth_bps": statistics.median(bws),
                },
            )
        )
    return out
