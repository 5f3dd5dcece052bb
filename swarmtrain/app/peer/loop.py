"""The loop of one training peer, shared by ``swarmtrain join`` volunteers and ``swarmtrain simulate`` peers.

One place builds the peer: its DHT node, the Byzantine guard (when ``peers.owner_check`` is on), the
``P2PCollective``, the robust reducer, and the ``Trainer`` with its strategy. The peer serves its state
to newcomers (``peers.StateServer``) after every committed sync and adopts the swarm's state when it
fell behind (``swarmtrain.app.peer.state``); it counts committed, late and failed rounds and the
parameter digest after each committed one, so every peer of a run can be checked for agreement.

What differs between a volunteer and a simulated peer is data, ``Membership`` (a fixed rank, or
open membership with a download at start). A caller adds hooks, ``PeerHooks``: wrap the collective,
the reducer or the batches (attacks do), report status and the result. It knows nothing of attacks.

If a round formed without this peer (it arrived late), the others committed an outer step it did not
take: it downloads the state that round committed before training on, so it never drifts from the
swarm. A volunteer with an identity file keeps the state of its last committed round next to it
(``swarmtrain.app.peer.saved_state``); restarted, it loads that state instead of downloading one when the
donors still vouch for it as their freshest. A volunteer out of step with the run (restarted, or
its last round did not commit) moves its round number up to the one the others publish
(``run_watch``, which also tells the live line what the peer waits for). SIGTERM or Ctrl-C starts a
preemption hand-off within ``peers.preempt_grace`` (``swarmtrain.app.peer.preemption``): finish the
step, train on to the next sync if it fits, wait until peers that stay hold the committed state,
withdraw the records and leave; a second signal aborts at once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from swarmtrain.app.peer.contract import (
    PUBLISH_EVERY_S,
    STATUS_EVERY_S,
    Membership,
    PeerHooks,
    PeerRun,
    PeerStatus,
    SyncClock,
)
from swarmtrain.app.peer.failure_streak import FailureStreak
from swarmtrain.app.peer.preemption import Preemption, finish_sync, withdraw_announcement
from swarmtrain.app.peer.realign import Realign, fast_forward, state_age, steps_behind
from swarmtrain.app.peer.run_agreement import run_settings
from swarmtrain.app.peer.run_checks import check_breakdown_point, check_settings, run_started
from swarmtrain.app.peer.run_watch import RunView, RunWatch, Waiting, WatchedCollective
from swarmtrain.app.peer.saved_state import read_saved_state, save_state, saved_state_path
from swarmtrain.app.peer.start_gate import start_together
from swarmtrain.app.peer.state import (
    adopt_saved_state,
    adopt_swarm_state,
    holds_the_freshest,
    newer_state_round,
    shared_digest,
    state_snapshot,
)
from swarmtrain.core.config import Config
from swarmtrain.core.errors import SwarmError
from swarmtrain.core.protocols import ByzantineTolerant, PeriodicStrategy

if TYPE_CHECKING:
    from swarmtrain.app.train.trainer import StepInfo, Trainer
    from swarmtrain.core.protocols import Collective, Reducer, StepReport

__all__ = ["Membership", "PeerHooks", "PeerStatus", "PeerRun", "SyncClock", "run_peer"]

logger = logging.getLogger(__name__)


def run_peer(cfg: Config, membership: Membership, hooks: PeerHooks | None = None) -> PeerRun:
    """Run one peer of the run named by ``cfg.peers`` until ``cfg.train.steps`` or a stop signal.

    Raises:
        SwarmError: the node could not start, or a configuration problem.
    """
    from peers import GracefulExit, PeerNode

    hooks = hooks or PeerHooks()
    preemption = Preemption(cfg.peers.preempt_grace)
    with GracefulExit(on_signal=preemption.on_signal) as stop, PeerNode(cfg.peers, role="trainer") as node:
        preemption.arm()
        peer = _Peer(cfg, node, membership, hooks, stop, preemption)
        if (grace_over := hooks.on_grace_over) is not None:
            preemption.last_words = lambda: grace_over(peer.result)
        try:
            return peer.run()
        finally:
            peer.close()


class _Stop(Exception):
    """Raised from the step callback when a stop signal arrived (caught in ``_Peer.run``)."""


class _Peer:
    """One peer's parts and counters while the loop runs."""

    def __init__(
        self,
        cfg: Config,
        node: Any,
        membership: Membership,
        hooks: PeerHooks,
        stop: Any,
        preemption: Preemption,
    ) -> None:
        from peers import StateServer
        from peers.trust.admission import OwnAdmission

        self.cfg, self.node, self.membership, self.hooks, self.stop = cfg, node, membership, hooks, stop
        # a volunteer watches its run: live trainers, the run's round, what it waits for (run_watch)
        self.watch = RunWatch(node, self._show_waiting) if membership.rank is None else None
        self._in_step = False  # its last round committed: its round number is the others'
        self._shown: PeerStatus | None = None  # the last status shown (the waiting line builds on it)
        self.guard = self._build_guard()
        self.p2p, self.collective = self._build_collective()
        self.trainer = self._build_trainer(self._build_reducer())
        if hooks.wrap_batches is not None:
            self.trainer.sampler = hooks.wrap_batches(self.trainer.sampler, self.trainer.model.vocab_size)
        rate = cfg.peers.state_upload_mib_s * 2**20  # donors keep training while newcomers pull
        self.server = StateServer(
            node, lambda: state_snapshot(self.trainer, self.p2p.round_id), upload_rate=rate
        )
        self.own_admission = OwnAdmission(node.admission, node.token, node.peer_id)
        self.p2p.deadlines.end_no_later_than(self.own_admission.rounds_end_by())  # the token's expiry
        self.streak = FailureStreak(membership.give_up_after)
        self.result = PeerRun(peer_id=node.peer_id)
        self._peers_seen = 1
        strategy = self.trainer.strategy
        self._clock = SyncClock(strategy.inner_steps if isinstance(strategy, PeriodicStrategy) else None)
        # a volunteer that keeps arriving late starts its periods a few steps ahead (0: fixed members)
        self._realign = Realign(self._clock.period if membership.rank is None else None)
        self._last_status = self._published = 0.0
        self.preemption = preemption  # the grace clock the stop signal starts
        self._leaving = False  # a stop signal was seen at a step (its record says so)
        self._sync_s = cfg.peers.join_window + 5.0  # a sync step's seconds (first guess, then measured)
        self._step_t, self._steps_per_s, self._state_age = time.monotonic(), 0.0, 0.0
        self._vouch: str | None = None  # the digest of the last state downloaded, when it may vouch for it
        #: tokens of its own steps since its last committed round (a downloaded state drops them)
        self._pending_tokens = 0
        #: where a volunteer keeps its last committed state, to resume from on restart (no identity
        #: file: a restart is a new peer, nothing kept)
        self.saved_path = saved_state_path(cfg.peers.identity_path) if membership.catch_up_on_join else None
        node.publish(**run_settings(cfg))  # what a newcomer checks its own settings against

    def _build_collective(self) -> tuple[Any, Collective]:
        """The ``P2PCollective`` (it keeps the round number and bans) and what the trainer talks
        through: it, or the hooks' wrapper of it."""
        from peers import P2PCollective
        from peers.rounds.seats import Seats

        cfg, membership = self.cfg, self.membership
        p2p = P2PCollective(
            self.node,
            min_peers=cfg.peers.min_peers,
            expected_peers=membership.n_peers,
            join_window=cfg.peers.join_window,
            guard=self.guard,
            seats=Seats.for_admission(self.node, cfg.peers.admission),  # None unless open
        )
        collective: Collective = p2p
        if self.hooks.wrap_collective is not None:
            collective = self.hooks.wrap_collective(self.node, p2p)
        if self.watch is not None:
            needs = max(cfg.peers.min_peers, 2)
            collective = WatchedCollective(collective, self.watch, lambda: p2p.round_id, needs)
        return p2p, collective

    def _build_reducer(self) -> Reducer:
        """The configured robust reducer (wrapped by the hooks); sets ``round_needs`` from it."""
        from peers.reducers import build_reducer

        cfg = self.cfg
        reducer: Reducer = build_reducer(
            cfg.peers.reducer, cfg.peers.byzantine_f, **cfg.peers.reducer_options
        )
        #: rows a round needs for the reducer's breakdown point (``byzantine_f`` tolerated)
        self.round_needs = (
            reducer.min_peers(reducer.n_byzantine) if isinstance(reducer, ByzantineTolerant) else 1
        )
        if self.hooks.wrap_reducer is not None:
            reducer = self.hooks.wrap_reducer(reducer)
        return reducer

    def _build_trainer(self, reducer: Reducer) -> Trainer:
        """The trainer on this peer's data: a shard of a fixed run, or a stream seeded by the peer ID."""
        from swarmtrain.app.train.trainer import Trainer

        cfg, membership = self.cfg, self.membership
        if membership.rank is None:
            return Trainer(
                cfg, collective=self.collective, reducer=reducer, data_seed=_data_seed(self.node.peer_id, cfg)
            )
        rank, n = membership.rank, membership.n_peers or 1
        return Trainer(cfg, collective=self.collective, peer_index=rank, num_peers=n, reducer=reducer)

    def _build_guard(self) -> Any:
        if not self.cfg.peers.owner_check:
            return None
        from peers.rounds.guard import build_guard

        return build_guard(self.node, self.cfg.peers)

    def run(self) -> PeerRun:
        """Catch up if asked, train, fill in the result, report it, then linger as a donor."""
        res, trainer = self.result, self.trainer
        if self.watch is not None:
            self.watch.start()
        if self.membership.catch_up_on_join:
            check_settings(self.node, self.cfg)  # the run's live trainers' settings
            # an open run's newcomers may arrive at any time: serve from the start (nobody there: we
            # start the run)
            window = self.cfg.peers.join_window
            resumed = self.resume_saved_state()
            if not resumed and not self.catch_up(wait_for_donor=window) and run_started(self.node):
                self._wait_for_the_runs_state()
            if self.result.downloads or resumed:  # behind its donors: start its first period ahead
                behind = steps_behind(self.node, self._state_age, None, self.trainer.tokens_per_step)
                fast_forward(self.trainer, self._realign.joined(behind))
            # its own saved state is one it committed itself; a downloaded one, when enough vouched
            self.server.refresh(vouch=resumed or self._vouch)
            check_breakdown_point(self.node, self.cfg, self.round_needs)
        elif self.membership.n_peers is not None:  # simulate: the first step together (start_gate)
            start_together(self.node, self.membership.n_peers, self.stop)
        if self.watch is not None:  # the others may have moved on by rounds that failed without it
            self._align_round(self.watch.read())
        logger.info("training from step %d, round %d", trainer.step, self.p2p.round_id)
        t0 = time.perf_counter()
        try:
            fit = trainer.fit(self.on_step)
            res.steps, res.final_train_loss = fit.steps, fit.final_train_loss
            res.final_val_loss = fit.final_val_loss
        except _Stop:
            res.stopped_by_signal = True
            res.steps = trainer.step
        res.wall_s = time.perf_counter() - t0
        res.tokens = trainer.tokens
        res.pending_tokens = self._pending_tokens
        res.final_digest = shared_digest(trainer)
        res.device = str(next(trainer.model.parameters()).device)
        ledger = self.node.ledger
        res.bytes_sent, res.bytes_received, res.ledger = ledger.sent, ledger.received, ledger.totals()
        res.banned = dict(self.guard.refresh()) if self.guard is not None else {}
        res.weights_over_cap = int(getattr(self.p2p, "counters", {}).get("weights_over_cap", 0))
        if self.hooks.on_finished is not None:
            self.hooks.on_finished(res)
        if self.stop.requested:  # preempted: stay a donor until peers that stay hold our state
            self.preemption.hand_off(self.node, self.server.announced_round, self.cfg.peers.state_vouchers)
        else:
            self.stop.wait(self.membership.linger_s)
        return res

    def _wait_for_the_runs_state(self) -> None:
        """The run is past its first round but no donor served a state yet (donors busy, a restarted
        peer slow to start, not yet two donors vouching): training from this peer's own initial
        parameters would give it a model nobody else has, so it waits for the state instead.

        Raises:
            SwarmError: no donor served the run's state within ``catch_up_timeout``.
        """
        rnd = run_started(self.node)
        timeout = self.membership.catch_up_timeout
        logger.warning("the run is at round %d: waiting up to %.0f s for a donor's state", rnd, timeout)
        if not self.catch_up(wait_for_donor=timeout):
            raise SwarmError(
                f"the run is at round {rnd} but no donor served its state within {timeout:.0f} s; "
                "this peer will not train from its own initial parameters"
            )

    def resume_saved_state(self) -> str | None:
        """A restarted volunteer: load its own state saved at its last committed round when the run's
        donors vouch for that very state as their freshest (no download). Returns its shared digest,
        or None (nothing loaded)."""
        saved = read_saved_state(self.saved_path, self.cfg.peers.run_id)
        if saved is None:
            return None
        wait = self.cfg.peers.join_window
        if not adopt_saved_state(self.node, self.trainer, self.p2p, saved, wait_for_donor=wait):
            return None
        self._state_age = state_age(saved.meta)
        logger.info(
            "resumed from its own saved state of round %d (step %d): no download",
            saved.round,
            self.trainer.step,
        )
        return saved.digest

    def save_committed_state(self, digest: str) -> None:
        """Keep the state this peer just committed on disk (one file, replaced atomically)."""
        if self.saved_path is None:
            return
        tensors, meta = state_snapshot(self.trainer, self.p2p.round_id)
        save_state(self.saved_path, tensors, meta, run_id=self.cfg.peers.run_id, digest=digest)

    def catch_up(self, *, wait_for_donor: float = 0.0, min_round: int = 0, fresh_wait: float = -1.0) -> bool:
        """Adopt the swarm's state (round >= ``min_round``, waited ``fresh_wait`` s for); record it."""
        fresh_wait = fresh_wait if fresh_wait >= 0 else self.cfg.peers.round_timeout if min_round else 0.0
        if self.watch is not None:
            self.watch.waiting = Waiting("state", self.p2p.round_id, time.monotonic())
        try:
            got = adopt_swarm_state(
                self.node,
                self.trainer,
                self.p2p,
                self.membership.catch_up_timeout,
                wait_for_donor=wait_for_donor,
                min_round=min_round,
                fresh_wait=fresh_wait,
            )
        finally:
            if self.watch is not None:
                self.watch.waiting = None
        if got is None:
            return False
        (donor, self._state_age, self._vouch), step, rnd = got, self.trainer.step, self.p2p.round_id
        digest = shared_digest(self.trainer)
        self._pending_tokens = 0  # its steps since its last commit are gone with its parameters
        self.result.downloads.append({"round": rnd, "step": step, "digest": digest, "donor": donor})
        logger.info("adopted the swarm's state: step %d, round %d", step, rnd)
        return True

    def on_step(self, info: StepInfo) -> None:
        """The trainer's step callback: count the sync, catch up when behind, report, obey a stop."""
        r = info.report
        self.result.comm_wait_s += float(r.extra.get("comm_wait_s", 0.0))
        now = time.monotonic()
        self._pending_tokens += self.trainer.tokens_per_step  # this step's (a sync's counts in its round)
        if r.synced:
            self._sync_s = now - self._step_t
        if self.watch is not None:
            self.watch.stepped()
            self._align_round(self.watch.view)
        self._step_t, self._steps_per_s = now, info.tokens_per_s / max(self.trainer.tokens_per_step, 1)
        note = ""
        if r.synced:
            note = self._after_sync(r)
            res = self.result
            self.node.publish(
                step=self.trainer.step,
                round=self.p2p.round_id,
                throughput=info.tokens_per_s,
                loss=info.loss,
                contributed_tokens=res.contributed_tokens,  # what a volunteer gave (status, dashboard)
                committed_rounds=res.committed_rounds,
                # round outcomes for `status` and the dashboard: counts and the last one
                committed=res.committed_rounds,
                late=res.late_rounds,
                failed=res.failed_rounds,
                outcome="committed" if r.committed else "late" if r.late else "failed",
            )
            self._clock.synced(self.trainer.step)
            self._published = now
        elif now - self._published >= PUBLISH_EVERY_S:  # live figures for `status` and the dashboard
            self._published = now
            self.node.publish(step=self.trainer.step, throughput=info.tokens_per_s, loss=info.loss)
        now = time.monotonic()
        due = (
            r.synced
            or info.step % self.cfg.train.log_interval == 0
            or now - self._last_status >= STATUS_EVERY_S
        )
        if self.hooks.on_status is not None and due:
            self._last_status = now
            self._shown = self._status(info, note)
            self.hooks.on_status(self._shown)
        if self.stop.requested and self._leave_now(info):
            raise _Stop
        self.own_admission.check()  # an expired token: one line and out, not failing rounds

    def _status(self, info: StepInfo, note: str) -> PeerStatus:
        """The live status after step ``info``: the live trainers' count as the watch last read it."""
        r, ledger, res = info.report, self.node.ledger, self.result
        view = self.watch.view if self.watch is not None else None
        steps_per_s = info.tokens_per_s / max(self.trainer.tokens_per_step, 1)
        return PeerStatus(
            step=self.trainer.step,
            round_id=self.p2p.round_id,
            loss=info.loss,
            peers=view.trainers if view is not None else self._peers_seen,
            bytes_up=ledger.sent,
            bytes_down=ledger.received,
            tokens_per_s=info.tokens_per_s,
            note=note,
            synced=r.synced,
            next_sync_s=self._clock.seconds_left(self.trainer.step, steps_per_s),
            committed=res.committed_rounds,
            failed=res.failed_rounds + res.late_rounds,
            committed_round=r.round_id if r.synced and r.committed else None,
        )

    def _show_waiting(self, text: str) -> None:
        """The watch's line while the training thread waits in a round or a download (its thread)."""
        if self.hooks.on_status is None:
            return
        base = self._shown or PeerStatus(self.trainer.step, self.p2p.round_id, float("nan"), 1, 0, 0, 0.0)
        self.hooks.on_status(replace(base, waiting=text, note="", synced=False))

    def _align_round(self, view: RunView | None) -> None:
        """Not in step with the run (restarted, or its last round failed): take a state committed since
        its own (``state.newer_state_round``), else move its round number up to the run's."""
        to = view.ahead_of(self.p2p.round_id) if view is not None and not self._in_step else None
        if to is None:
            return
        window, vouchers = self.cfg.peers.join_window, self.cfg.peers.state_vouchers
        if (newer := newer_state_round(self.node, self.p2p, vouchers, window)) is not None:
            logger.info("the run is at round %d, a state of round %d is committed: taking it", to, newer)
            if self.catch_up(min_round=newer, fresh_wait=window):
                return
        logger.info("the run is at round %d: this peer moves up from round %d", to, self.p2p.round_id)
        self.p2p.round_id = to

    def _leave_now(self, info: StepInfo) -> bool:
        """A stop signal arrived: leave after this step, or (the first time, when the next sync and
        its round fit in the grace) train on to that sync so this peer's work since the last one counts."""
        left = self.preemption.left()
        if self._leaving:  # training on to the sync: leave once it happened or time is short
            return info.report.synced or left <= self._sync_s
        self._leaving = True
        self.node.publish(leaving=1)  # no other leaving peer counts on this one to keep the state
        self.server.announce_leaving()
        steps_per_s = info.tokens_per_s / max(self.trainer.tokens_per_step, 1)
        to_sync = None if info.report.synced else self._clock.seconds_left(self.trainer.step, steps_per_s)
        if self._peers_seen > 1 and finish_sync(to_sync, self._sync_s, left):  # a round it can join
            logger.warning("training on to the next sync (~%.0f s) before leaving", to_sync or 0.0)
            self.p2p.deadlines.end_no_later_than(time.monotonic() + left)  # that round ends in the grace
            return False
        return True

    def _after_sync(self, r: StepReport) -> str:
        """Count one sync and adopt the swarm's state when this peer missed a step; returns a note."""
        res = self.result
        self._peers_seen = r.participants
        res.peak_sync_bytes_sent = max(res.peak_sync_bytes_sent, r.bytes_sent)
        if "fragment" in r.extra:  # a strategy that syncs one fragment per round says which
            counts = res.fragment_rounds.setdefault(int(r.extra["fragment"]), dict.fromkeys(_OUTCOMES, 0))
            counts["committed" if r.committed else "late" if r.late else "failed"] += 1
        self._in_step = r.committed
        if r.committed:
            self.streak.committed()
            res.committed_rounds += 1
            res.contributed_tokens += self._pending_tokens  # its steps since the last commit counted
            self._pending_tokens = 0
            res.sync_digests[r.round_id] = shared_digest(self.trainer)
            # a state it committed itself: vouched for, and signed as the round's commit certificate
            self.server.refresh(vouch=res.sync_digests[r.round_id], committed_by=r.participants)
            self.save_committed_state(res.sync_digests[r.round_id])
            fast_forward(self.trainer, self._realign.committed())
            window = self.p2p.deadlines.join_window()  # measured (peers.rounds.deadlines)
            logger.info(
                "round %d committed (%d peers; join window %.1f s; step %d, digest %s)",
                r.round_id,
                r.participants,
                window,
                self.trainer.step,
                res.sync_digests[r.round_id][:12],
            )
            return ""
        if r.late:
            # the others commit the round we missed: wait for the state it produces (the donors
            # announce it as round ``p2p.round_id``), not the one before it
            res.late_rounds += 1
            # the round that formed without it took the number before ``round_id`` (r.round_id is -1)
            logger.info("round %d went on without this peer", self.p2p.round_id - 1)
            if self.catch_up(min_round=self.p2p.round_id):
                res.late_caught_up += 1
                self.server.refresh(vouch=self._vouch)
                behind = steps_behind(self.node, self._state_age, self._steps_per_s)
                if skipped := fast_forward(self.trainer, self._realign.late(behind)):
                    logger.info("late: its sync periods now start %d steps ahead", skipped)
            return "round went on without us: catching up"
        res.failed_rounds += 1
        self.streak.failed(r.reason)
        note = f"round failed: {r.reason[:60]}" if r.reason else "round failed"
        vouchers = self.cfg.peers.state_vouchers
        if not self.membership.catch_up_after_failure or holds_the_freshest(
            self.node, self.trainer, self.p2p, vouchers
        ):
            return note
        if self.catch_up():
            self.server.refresh(vouch=self._vouch)
        return f"{note}; catching up"

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
        self.server.close()
        withdraw_announcement(self.node)  # newcomers must not ask a peer that left
        close = getattr(self.collective, "close", None)  # a wrapper closes what it wraps
        if callable(close):
            close()
        self.trainer.close()


_OUTCOMES = ("committed", "late", "failed")


def _data_seed(peer_id: str, cfg: Config) -> int:
    """A volunteer's data seed: it knows no rank, so its stream is seeded from its peer ID."""
    return int.from_bytes(hashlib.sha256(f"{cfg.train.seed}:{peer_id}".encode()).digest()[:4], "little")
