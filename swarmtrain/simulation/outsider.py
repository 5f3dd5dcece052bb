"""An intruder for ``swarmtrain simulate --intruders K``: a process outside the run that attacks it
for as long as the run lasts, with every attack below, tried the way an outsider would.

It knows what any outsider knows, the bootstrap addresses and the run ID, and has its own libp2p
identity but no admission (no token, not on the allowlist). It runs a plain hivemind DHT node (for
unsigned records) beside a :class:`peers.PeerNode` that signs with its own key, and in a loop:

* ``fake_records``: unsigned join and group records for the coming rounds (leader "1", members
  ``["1"]``): on unsigned records this blocked every round;
* ``signed_records``: the same, signed with its own key (itself as leader and only member);
* ``junk_records``: 2 KiB values under the join keys (1 MiB ones hid a real join record);
* ``peer_records``: tombstones for the honest peers and a fake peer record (they blanked the status);
* ``accusations``: a signed suspicion record accusing every honest peer (it got one banned);
* ``pushed_messages``: joins, member lists and a part with weight 1e30 sent straight to the honest
  peers' handlers (the weight hijacked the mean);
* ``stalled_streams``, ``zero_byte_flood``, ``trickle``, ``future_flood``: the resource attacks of
  :mod:`swarmtrain.simulation.intruders`;
* ``state_downloads``: downloads of the state the honest peers serve;
* ``forged_state``: a state of round 10^12 announced for newcomers to adopt.

After each attack it reports its counts (``("intruder", index, report)`` on the queue): attempts per
kind (records, messages, streams or downloads), and ``accepted`` per kind, what the honest peers let
through (messages acknowledged, streams held, states served; bytes stored for ``future_flood``).
An intruder that fails reports ``("intruder_error", index, message)``.
Nothing in the library imports this module.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack

from swarmtrain.core.config import Config

__all__ = ["CPU_SHARE", "KINDS", "CpuCap", "intruder_main"]

logger = logging.getLogger(__name__)

KINDS = (
    "fake_records",
    "signed_records",
    "junk_records",
    "peer_records",
    "accusations",
    "pushed_messages",
    "stalled_streams",
    "zero_byte_flood",
    "trickle",
    "future_flood",
    "state_downloads",
    "forged_state",
)
_AHEAD = 4  # rounds ahead the records and messages aim at
_LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
_JUNK = 2048  # bytes of one junk value
_FLOOD = 256 * 1024  # bytes of one future-round message


class _Intruder:
    """One intruder's attacks on run ``run`` (see the module docstring)."""

    def __init__(self, node: Any, plain: Any, run: str) -> None:
        from peers.state.state_transfer import StateServer

        self.node, self.plain, self.run = node, plain, run
        self.attempts: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.forged = StateServer(node, _forged_state)

    def report(self) -> dict[str, Any]:
        return {
            "peer_id": self.node.peer_id,
            "attempts": {k: self.attempts[k] for k in KINDS},
            "accepted": {k: self.accepted[k] for k in KINDS},
        }

    def targets(self) -> tuple[list[str], int]:
        """The honest peers it sees in the run's records, and the highest round they reached."""
        recs = [r for r in self.node.live_peers(self.run, timeout=10.0) if r.peer_id != self.node.peer_id]
        honest = [r.peer_id for r in recs if r.role == "trainer"]
        return honest, max((r.round for r in recs), default=0)

    def records(self, honest: list[str], now: int) -> None:
        from hivemind.utils import get_dht_time

        from peers.dht.records import PeerRecord, encode_record, peers_key
        from peers.trust.suspicion import AccusationTable, encode_signed, suspicion_key

        exp = get_dht_time() + 120
        futs = []

        def store(dht: Any, key: str, value: bytes, subkey: str, kind: str) -> None:
            futs.append(dht.store(key, value, exp, subkey=subkey, return_future=True))
            self.attempts[kind] += 1

        me = self.node.peer_id
        for r in range(now, now + _AHEAD):
            key = f"{self.run}.reduce.{r}"
            store(self.plain, f"{key}.join", b"1", "1", "fake_records")
            store(self.plain, f"{key}.group", msgpack.packb(["1"]), "1", "fake_records")
            store(self.node.dht, f"{key}.join", b"1", me, "signed_records")
            store(self.node.dht, f"{key}.group", msgpack.packb([me]), me, "signed_records")
            for j in range(2):  # (hivemind's pipe to its DHT process breaks on bursts of large values)
                store(self.plain, f"{key}.join", b"\0" * _JUNK, f"junk{r}.{j}", "junk_records")
        for h in honest:
            tomb = PeerRecord(peer_id=h, run_id=self.run, left=True, time=get_dht_time())
            store(self.plain, peers_key(self.run), encode_record(tomb), h, "peer_records")
        fake = PeerRecord(peer_id="1", run_id=self.run, time=get_dht_time())
        store(self.plain, peers_key(self.run), encode_record(fake), "1", "peer_records")
        table = AccusationTable()
        for h in honest:
            for r in range(max(now - 8, 0), now + 1):
                table.add_owner_failure(r, h, me)
            table.outliers[h] = [now + 1, now + 1]
        store(
            self.node.dht,
            suspicion_key(self.run),
            encode_signed(self.run, table, self.node.signer),
            me,
            "accusations",
        )
        end = time.monotonic() + 5.0  # the honest nodes refuse them; no need to wait for each answer
        for f in futs:
            try:
                f.result(max(end - time.monotonic(), 0.01))
            except Exception as e:  # a store the network refused (or slow to say so): what we hope for
                logger.debug("intruder store failed: %s", e)

    def messages(self, honest: list[str], now: int) -> None:
        from peers.wire.messages import Envelope
        from swarmtrain.simulation.intruders import Target, offer

        listed = msgpack.packb(sorted([self.node.peer_id, *honest]))
        for h in honest:
            t = Target(self.node.p2p, h, self.run)
            msgs: list[tuple[Envelope, list[bytes]]] = []
            for r in (now, now + 1):
                msgs.append((Envelope(type="join", run=self.run, kind="reduce", round=r), []))
                msgs.append(
                    (
                        Envelope(
                            type="grp", run=self.run, kind="reduce", round=r, frames=1, nbytes=len(listed)
                        ),
                        [listed],
                    )
                )
                body = b"\0" * 4096
                msgs.append(
                    (
                        Envelope(
                            type="part",
                            run=self.run,
                            kind="reduce",
                            round=r,
                            index=0,
                            weight=1e30,
                            frames=1,
                            nbytes=len(body),
                            numel=1024,
                        ),
                        [body],
                    )
                )
            self.attempts["pushed_messages"] += len(msgs)
            self.accepted["pushed_messages"] += self.node.loop.run(offer(t, msgs, 10.0), 15.0)

    def floods(self, victim: str, now: int) -> None:
        from swarmtrain.simulation import intruders as fl

        t = fl.Target(self.node.p2p, victim, self.run)
        run = self.node.loop.run
        stalled = run(fl.stalled_streams(t, 16, now, hold=3.0), 20.0)
        self.attempts["stalled_streams"] += stalled["opened"]
        self.accepted["stalled_streams"] += stalled["opened"] - stalled["closed_by_victim"]
        zero = run(fl.zero_byte_flood(t, 2000, now, timeout=5.0), 20.0)
        self.attempts["zero_byte_flood"] += zero["sent"]
        self.accepted["zero_byte_flood"] += zero["accepted"]
        slow = run(fl.trickle(t, now, nbytes=4096, interval=0.5, limit=5.0), 20.0)
        self.attempts["trickle"] += 1
        self.accepted["trickle"] += int(not slow["closed"])
        fut = run(fl.future_flood(t, range(now, now + _AHEAD), 2, _FLOOD, timeout=5.0), 20.0)
        self.attempts["future_flood"] += fut["offered"] // _FLOOD  # messages
        self.accepted["future_flood"] += fut["accepted"]  # bytes

    def state(self, honest: list[str]) -> None:
        from peers.state.state_transfer import download_state

        self.forged.refresh()
        self.attempts["forged_state"] += 1
        self.attempts["state_downloads"] += 1
        try:
            _, meta = download_state(self.node, timeout=10.0, wait_for_donor=3.0, run_id=self.run)
        except Exception as e:  # refused: what admission is for
            logger.debug("intruder state download refused: %s", e)
            return
        # (another intruder's forged state does not count: only what an honest donor served)
        self.accepted["state_downloads"] += int(meta.get("donor") in honest)


def _forged_state() -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    return {"w": torch.full((1024,), 0.0123)}, {"round": 10**12, "step": 10**12}


def intruder_main(
    index: int, cfg_json: str, initial: list[str], q: Any, log_level: int = logging.ERROR
) -> None:
    """Process entry: attack the run of ``cfg_json`` until SIGTERM, reporting after each attack."""
    import hivemind

    from peers import PeerNode
    from peers.dht.process import GracefulExit
    from swarmtrain.simulation.children import attacker_priority
    from swarmtrain.simulation.logs import quiet_logs

    attacker_priority()
    quiet_logs(log_level)
    try:
        cfg = Config.model_validate_json(cfg_json)
        # an outsider: its own throwaway identity, no token, and it admits anyone on its side
        own = cfg.peers.model_copy(
            update={
                "admission": "open",
                "token": None,
                "run_public_key": None,
                "allowlist": [],
                "identity_path": None,
                "initial_peers": initial,
            }
        )
        with GracefulExit() as stop, PeerNode(own, role="intruder") as node:
            plain = hivemind.DHT(initial_peers=initial, host_maddrs=_LOOPBACK, start=True)
            try:
                _attack(_Intruder(node, plain, cfg.peers.run_id), lambda: stop.requested, q, index)
            finally:
                plain.shutdown()
    except BaseException as e:  # report (the run's result lists it), never hang the parent
        q.put(("intruder_error", index, f"intruder {index}: {type(e).__name__}: {e}"))


#: the share of one core an intruder's own process may use, by its CPU time: on a real network its
#: cores are its own, while on the run's one machine an unpaced loop (``nice`` alone does not bound
#: it) took the honest peers' CPU and starved a run to twice its time. What the attacks make the
#: honest peers do is not bounded.
CPU_SHARE = 0.25


class CpuCap:
    """Keeps this process's CPU time within ``share`` of the wall time since it was made."""

    def __init__(self, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.share = share
        self._cpu0, self._t0 = time.process_time(), time.monotonic()

    def due_s(self) -> float:
        """Seconds to sleep so that the CPU time used is ``share`` of the wall time (0: within)."""
        used = time.process_time() - self._cpu0
        return max(used / self.share - (time.monotonic() - self._t0), 0.0)

    def pause(self, stopped: Callable[[], bool]) -> None:
        """Sleep off what is due, in slices, returning early once ``stopped()``."""
        end = time.monotonic() + self.due_s()
        while not stopped() and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))


def _attack(it: _Intruder, stopped: Callable[[], bool], q: Any, index: int) -> None:
    q.put(("intruder", index, it.report()))
    cap = CpuCap(CPU_SHARE)
    victim = 0
    while not stopped():
        honest, now = it.targets()
        logger.debug("intruder %d: %d honest peers seen, round %d", index, len(honest), now)
        if not honest:
            time.sleep(0.5)
            continue
        victim = (victim + 1) % len(honest)
        attacks: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (it.records, (honest, now)),
            (it.messages, (honest, now)),
            (it.floods, (honest[victim], now)),
            (it.state, (honest,)),
        ]
        for attack, args in attacks:
            if stopped():
                break
            t0 = time.monotonic()
            try:
                attack(*args)
                logger.debug("intruder %d: %s took %.1f s", index, attack.__name__, time.monotonic() - t0)
            except Exception as e:  # a refused connection or a closed loop: next attack
                logger.info("intruder attack failed: %s: %s", type(e).__name__, e)
            q.put(("intruder", index, it.report()))
            cap.pause(stopped)
