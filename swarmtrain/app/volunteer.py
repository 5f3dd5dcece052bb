"""One volunteer peer of an open run: what ``swarmtrain join`` runs.

A volunteer starts a DHT node, downloads the run's current state from a live donor (model, strategy
state with the outer optimizer, step and round number; safetensors bytes checked against the hash
the donor announced), trains with the configured strategy over ``peers.P2PCollective``, and serves
its own state to later newcomers after every committed sync. Membership is open: rounds close
``peers.join_window`` seconds after their leader arrives, so nobody waits for a fixed peer count.

If a round formed without this peer (it arrived late, e.g. right after its download), the others
committed an outer step it did not take: it downloads the state that round committed (waiting up to
``peers.round_timeout`` for a donor to announce it) before training on, so it never drifts from the
swarm. After a round that failed for other reasons it adopts the freshest state announced. SIGTERM
or Ctrl-C finishes the current step and leaves cleanly (the node deregisters); a second signal aborts
at once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmtrain.app.checkpoint import CheckpointError, pack_state, unpack_state
from swarmtrain.core.config import Config
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError
from swarmtrain.simulation.runner import param_digest, shared_parameters

__all__ = [
    "VolunteerStatus",
    "VolunteerResult",
    "run_volunteer",
    "state_snapshot",
    "apply_state",
    "adopt_swarm_state",
]

logger = logging.getLogger(__name__)

_MODEL = "model."


@dataclass
class VolunteerStatus:
    """The live status line of a volunteer."""

    step: int
    round_id: int
    loss: float
    peers: int
    bytes_up: int
    bytes_down: int
    tokens_per_s: float
    note: str = ""


@dataclass
class VolunteerResult:
    """Summary of a volunteer's run (``swarmtrain join --json`` writes it)."""

    peer_id: str
    steps: int
    final_train_loss: float
    final_val_loss: float | None
    final_digest: str
    sync_digests: dict[int, str] = field(default_factory=dict)
    downloads: list[dict[str, Any]] = field(default_factory=list)
    committed_rounds: int = 0
    late_rounds: int = 0
    failed_rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    ledger: dict[str, Any] = field(default_factory=dict)
    stopped_by_signal: bool = False


def state_snapshot(trainer: Any, round_id: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What a donor serves: model parameters, the strategy's state, step and round number."""
    tensors = {_MODEL + n: p.detach().to("cpu", copy=True) for n, p in trainer.model.named_parameters()}
    strat_tensors, skeleton = pack_state(trainer.strategy.state_dict(), prefix="strategy")
    tensors.update(strat_tensors)
    meta = {
        "round": int(round_id),
        "step": int(trainer.step),
        "strategy_name": trainer.strategy.name,
        "strategy": skeleton,
    }
    return tensors, meta


def apply_state(trainer: Any, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> int:
    """Load a downloaded state into ``trainer``; returns the round number to adopt.

    Everything is checked against this peer's own model and strategy before anything changes:
    a bad state raises ``ProtocolError`` and leaves the trainer as it was.
    """
    if meta.get("strategy_name") != trainer.strategy.name:
        raise ProtocolError(
            f"donor runs strategy {meta.get('strategy_name')!r}, this peer {trainer.strategy.name!r}"
        )
    step, rnd = meta.get("step"), meta.get("round")
    if not isinstance(step, int) or not isinstance(rnd, int) or step < 0 or rnd < 0:
        raise ProtocolError("state meta lacks a valid step and round")
    ours = dict(trainer.model.named_parameters())
    theirs = {n[len(_MODEL):]: t for n, t in tensors.items() if n.startswith(_MODEL)}
    if set(theirs) != set(ours):
        raise ProtocolError("downloaded model tensors do not match this model's parameters")
    for n, p in ours.items():
        t = theirs[n]
        if tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
            raise ProtocolError(f"downloaded tensor {n!r}: {tuple(t.shape)} {t.dtype} does not fit")
    try:
        strategy_state = unpack_state(meta.get("strategy"), tensors)
    except CheckpointError as e:
        raise ProtocolError(f"downloaded strategy state: {e}") from None
    backup = trainer.strategy.state_dict()
    try:
        trainer.strategy.load_state_dict(strategy_state)
    except (SwarmError, KeyError, TypeError, ValueError) as e:
        trainer.strategy.load_state_dict(backup)
        raise ProtocolError(f"downloaded strategy state does not fit: {e}") from None
    with torch.no_grad():
        for n, p in ours.items():
            p.copy_(theirs[n])
    trainer.step = step
    return rnd


def adopt_swarm_state(
    node: Any,
    trainer: Any,
    collective: Any,
    timeout: float,
    *,
    wait_for_donor: float = 0.0,
    min_round: int = 0,
    fresh_wait: float = 0.0,
) -> bool:
    """Download the run's state from a donor this peer has not banned and load it into ``trainer``
    (``peers.download_state`` says what ``min_round``/``fresh_wait`` do). The collective's round number
    never goes back: a donor's snapshot can name a round whose group has formed since, and re-joining
    it would only be late again. Returns False (logged) when no usable state came; nothing changed then.
    """
    from peers import download_state

    try:
        tensors, meta = download_state(
            node,
            timeout,
            wait_for_donor=wait_for_donor,
            min_round=min_round,
            fresh_wait=fresh_wait,
            exclude=collective.banned,
        )
        collective.round_id = max(apply_state(trainer, tensors, meta), collective.round_id)
    except (PeerTimeoutError, ProtocolError) as e:
        logger.warning("no usable state from the swarm (%s)", e)
        return False
    return True


def _data_seed(peer_id: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{peer_id}".encode()).digest()[:4], "little")


def run_volunteer(
    cfg: Config,
    *,
    on_status: Callable[[VolunteerStatus], None] | None = None,
    download_timeout: float = 120.0,
) -> VolunteerResult:
    """Join the run named by ``cfg.peers`` and train until ``cfg.train.steps`` or a stop signal.

    Raises:
        SwarmError: the node could not start, or a configuration problem.
    """
    from peers import GracefulExit, P2PCollective, PeerNode, StateServer
    from peers.reducers import build_reducer
    from swarmtrain.app.trainer import StepInfo, Trainer

    with GracefulExit() as stop, PeerNode(cfg.peers, role="trainer") as node:
        collective = P2PCollective(
            node, min_peers=cfg.peers.min_peers, expected_peers=None, join_window=cfg.peers.join_window
        )
        reducer = build_reducer(cfg.peers.reducer, cfg.peers.byzantine_f, **cfg.peers.reducer_options)
        trainer = Trainer(
            cfg, collective=collective, reducer=reducer, data_seed=_data_seed(node.peer_id, cfg.train.seed)
        )
        result = VolunteerResult(peer_id=node.peer_id, steps=0, final_train_loss=float("nan"),
                                 final_val_loss=None, final_digest="")

        def catch_up(wait_for_donor: float, min_round: int = 0) -> bool:
            fresh_wait = cfg.peers.round_timeout if min_round else 0.0
            if not adopt_swarm_state(
                node, trainer, collective, download_timeout,
                wait_for_donor=wait_for_donor, min_round=min_round, fresh_wait=fresh_wait,
            ):
                return False
            digest = param_digest(shared_parameters(trainer.strategy, trainer.model))
            result.downloads.append({"round": collective.round_id, "step": trainer.step, "digest": digest})
            logger.info("adopted the swarm's state: step %d, round %d", trainer.step, collective.round_id)
            return True

        server = StateServer(node, lambda: state_snapshot(trainer, collective.round_id))
        try:
            catch_up(wait_for_donor=cfg.peers.join_window)  # nobody there: we start the run
            server.refresh()
            peers_seen = [1]

            def on_step(info: StepInfo) -> None:
                r = info.report
                note = ""
                if r.synced:
                    peers_seen[0] = r.participants
                    if r.committed:
                        result.committed_rounds += 1
                        digest = param_digest(shared_parameters(trainer.strategy, trainer.model))
                        result.sync_digests[r.round_id] = digest
                        server.refresh()
                    elif r.late:
                        # the others commit the round we missed: wait for the state it produces (the
                        # donors announce it as round ``collective.round_id``), not the one before it
                        result.late_rounds += 1
                        note = "round went on without us: catching up"
                        catch_up(wait_for_donor=0.0, min_round=collective.round_id)
                        server.refresh()
                    else:
                        result.failed_rounds += 1
                        note = "round failed: catching up"
                        catch_up(wait_for_donor=0.0)
                        server.refresh()
                    node.publish(step=trainer.step, round=collective.round_id, throughput=info.tokens_per_s,
                                 loss=info.loss)
                if on_status is not None and (r.synced or info.step % cfg.train.log_interval == 0):
                    on_status(VolunteerStatus(
                        step=trainer.step, round_id=collective.round_id, loss=info.loss,
                        peers=peers_seen[0], bytes_up=node.ledger.sent, bytes_down=node.ledger.received,
                        tokens_per_s=info.tokens_per_s, note=note,
                    ))
                if stop.requested:
                    raise _Stop

            try:
                fit = trainer.fit(on_step)
                result.steps, result.final_train_loss = fit.steps, fit.final_train_loss
                result.final_val_loss = fit.final_val_loss
            except _Stop:
                result.stopped_by_signal = True
                result.steps = trainer.step
            result.final_digest = param_digest(shared_parameters(trainer.strategy, trainer.model))
            result.bytes_sent, result.bytes_received = node.ledger.sent, node.ledger.received
            result.ledger = node.ledger.totals()
            # stay a donor a little longer so a peer that finishes its last round can still sync
            if not stop.requested:
                stop.wait(min(cfg.peers.join_window, 5.0))
        finally:
            server.close()
            collective.close()
            trainer.close()
        return result


class _Stop(Exception):
    """Raised from the step callback when a stop signal arrived (caught in run_volunteer)."""

