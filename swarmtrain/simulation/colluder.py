"""A colluding donor for ``swarmtrain simulate --colluders K``: an *admitted* process (its own
identity and a join token of the run, like an honest peer's) that trains nothing and plants a state.

It downloads the run's state once from an honest donor (it is admitted: donors serve it), loads it
into a trainer of the run's model with the app's own code (``swarmtrain.app.peer.state``), shifts
every shared parameter and local weight by :data:`SHIFT`, and from then on announces that forged
state one round ahead of the honest donors' freshest announcement (within the witness bound,
``peers.state.donors.ROUND_SLACK``), with the step of the most advanced honest peer. Each
announcement vouches for the forged digest (the shared digest a newcomer checks) and signs a commit
certificate of it as a group of ``K`` (the colluders: each signs its own, so the ``K`` of them are a
quorum of the group they claim, and vouch for each other's state). Its peer record names the same
round, so each colluder bears out the others' round.

The attack acts when an honest peer downloads a state: the run's restarted peer
(``swarmtrain.simulation.supervisor``, the newcomer event). The rules before commit certificates
(vouching by two donors, witnessed rounds) take this state; certificates refuse it while the
colluders are fewer than half of the established live peers.

After each announcement it reports ``("colluder", index, {"peer_id", "announced", "round",
"served"})``; a colluder that fails reports ``("colluder_error", index, message)``.
Nothing in the library imports this module.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from swarmtrain.core.config import Config

__all__ = ["SHIFT", "colluder_main"]

logger = logging.getLogger(__name__)

#: what the forged state adds to every shared parameter and local weight
SHIFT = 0.5
_POLL_S = 0.5  # seconds between looks at the honest donors' round
_MAX_FAILURES = 20  # failed looks or forgeries before the colluder gives up (and reports why)


class _Colluder:
    """One colluder's forged state and its announcements (see the module docstring)."""

    def __init__(self, node: Any, cfg: Config, group: int) -> None:
        from peers.state.state_transfer import StateServer

        self.node, self.cfg, self.group = node, cfg, group
        self.run = cfg.peers.run_id
        self.trainer: Any = None
        self.digest = ""
        self.round = self.step = 0
        self.announced = 0
        self.failures: list[str] = []
        self.server = StateServer(node, self._snapshot)

    def _snapshot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from swarmtrain.app.peer.state import state_snapshot

        tensors, meta = state_snapshot(self.trainer, self.round)
        meta["step"] = self.step  # the honest peers' step: a newcomer is set neither back nor ahead
        return tensors, meta

    def report(self) -> dict[str, Any]:
        return {
            "peer_id": self.node.peer_id,
            "announced": self.announced,
            "round": self.round,
            "served": self.server.served,
        }

    def honest_front(self) -> tuple[int, int, frozenset[str]]:
        """The honest donors' freshest announced round (or published round), the highest honest step
        and the peers that are not honest trainers (colluders: never a source)."""
        from peers.state.donors import announcements

        recs = self.node.live_peers(self.run, timeout=10.0)
        others = frozenset(r.peer_id for r in recs if r.role != "trainer")
        trainers = [r for r in recs if r.role == "trainer"]
        rounds = [a[0] for a in announcements(self.node, self.run, 10.0) if a[1] not in others]
        rnd = max([*rounds, *(r.round for r in trainers)], default=0)
        return rnd, max((r.step for r in trainers), default=0), others

    def forge(self, exclude: frozenset[str]) -> None:
        """Download the honest state, load it into a trainer of the run's model and shift it."""
        import torch

        from peers import P2PCollective
        from peers.state.state_transfer import download_state
        from swarmtrain.app.peer.state import apply_state, shared_digest, shared_parameters
        from swarmtrain.app.train.trainer import Trainer

        tensors, meta = download_state(self.node, timeout=60.0, wait_for_donor=5.0, exclude=exclude)
        # the strategy needs a collective; this one is in a namespace of its own and never syncs
        rounds = P2PCollective(self.node, run_id=f"{self.run}.colluder.{self.node.peer_id[-8:]}")
        trainer = Trainer(self.cfg, collective=rounds, peer_index=0, num_peers=1)
        apply_state(trainer, tensors, meta)
        with torch.no_grad():
            own = {id(p) for p in trainer.model.parameters()}
            for p in trainer.model.parameters():
                p.add_(SHIFT)
            for t in shared_parameters(trainer.strategy, trainer.model).values():
                if id(t) not in own:  # a strategy's anchor kept apart from the model (DiLoCo)
                    t.add_(SHIFT)
        self.trainer, self.digest = trainer, shared_digest(trainer)
        logger.info("colluder: forged state %s from donor %s", self.digest[:12], meta.get("donor"))

    def tick(self) -> bool:
        """Announce the forged state one round ahead of the honest front; returns whether it did."""
        rnd, step, others = self.honest_front()
        if rnd <= 0:
            return False  # nothing committed yet: no state to forge from
        if self.trainer is None:
            self.forge(others)
        if rnd + 1 == self.round and step <= self.step:
            return False
        self.round, self.step = rnd + 1, max(step, self.step)
        self.server.refresh(vouch=self.digest, committed_by=self.group)
        self.node.publish(round=self.round, step=self.step)
        self.announced += 1
        return True


def colluder_main(index: int, group: int, cfg_json: str, q: Any, log_level: int = logging.ERROR) -> None:
    """Process entry: plant the forged state (module docstring) until SIGTERM, reporting as it goes.

    Args:
        index: this colluder's index (its report's key).
        group: how many colluders there are (the group size its certificates claim).
        cfg_json: its admitted config (identity, token and initial peers set).
        q: the run's shared report queue.
    """
    from peers import PeerNode
    from peers.dht.process import GracefulExit
    from swarmtrain.simulation.children import attacker_priority
    from swarmtrain.simulation.logs import quiet_logs

    attacker_priority()
    quiet_logs(log_level)
    try:
        cfg = Config.model_validate_json(cfg_json)
        with GracefulExit() as stop, PeerNode(cfg.peers, role="colluder") as node:
            c = _Colluder(node, cfg, group)
            q.put(("colluder", index, c.report()))
            while not stop.requested:
                t0 = time.monotonic()
                try:
                    if c.tick():
                        q.put(("colluder", index, c.report()))
                except Exception as e:  # a DHT or download hiccup: try again (reported, not fatal)
                    logger.info("colluder %d: %s: %s", index, type(e).__name__, e)
                    c.failures.append(f"{type(e).__name__}: {e}"[:200])
                    if len(c.failures) >= _MAX_FAILURES:
                        raise
                stop.wait(max(_POLL_S - (time.monotonic() - t0), 0.05))
            q.put(("colluder", index, c.report()))
            c.server.close()
    except BaseException as e:  # report (the run's result lists it), never hang the parent
        q.put(("colluder_error", index, f"colluder {index}: {type(e).__name__}: {e}"))
