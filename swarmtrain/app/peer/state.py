"""A peer's shareable state: what a donor serves, how a newcomer or a late peer adopts it, and its digest.

The state is the model's parameters, the strategy's state (outer optimizer, anchors, residuals...),
the inner optimizer's per-parameter state (a DataParallel peer that started with fresh moments would
step differently from the swarm; a DiLoCo peer gets a warm start), the step count and the round
number, as safetensors tensors plus a JSON skeleton
(``swarmtrain.app.train.checkpoint.pack_state``), so neither side ever unpickles peer bytes. Loading goes
through ``Trainer.load_peer_state``, the same checks a checkpoint resume runs; this module adds only
what belongs to the exchange: the donor's strategy name, its step and round fields, and the round
number that never goes back.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from peers.state.donors import MAX_ROUND
from swarmtrain.app.peer.realign import skip_rounds, state_age
from swarmtrain.app.train.checkpoint import CheckpointError, pack_state, unpack_state
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError
from swarmtrain.core.protocols import GlobalParameters, Strategy

if TYPE_CHECKING:
    from swarmtrain.app.peer.saved_state import SavedState
    from swarmtrain.app.train.trainer import Trainer

__all__ = [
    "vouchable",
    "param_digest",
    "shared_parameters",
    "shared_digest",
    "outer_state_tensors",
    "own_settings",
    "local_weights",
    "state_snapshot",
    "apply_state",
    "adopt_swarm_state",
    "adopt_saved_state",
    "newer_state_round",
    "holds_the_freshest",
]

logger = logging.getLogger(__name__)

_MODEL = "model."  # name prefix of the model's tensors in a snapshot; the strategy's use "strategy"


def param_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's bytes, in name order: equal digests mean bit-identical tensors."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def shared_parameters(strategy: Strategy, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters every peer must agree on: the strategy's global (anchor) parameters when it
    keeps them apart from the local model (``GlobalParameters``: DiLoCo, StreamingDiLoCo), else the
    model's own."""
    if isinstance(strategy, GlobalParameters):
        return dict(strategy.global_parameters())
    return dict(model.named_parameters())


def outer_state_tensors(strategy: Strategy) -> dict[str, torch.Tensor]:
    """The outer optimizer's state every peer shares (its momentum, fp32 or 8-bit codes and scales),
    for strategies that keep global parameters apart (``{}`` for the others)."""
    store = getattr(strategy, "store", None)
    if not isinstance(strategy, GlobalParameters) or not callable(getattr(store, "outer_state", None)):
        return {}
    state = store.outer_state()  # type: ignore[union-attr]
    out = {f"outer.{n}": t for n, t in dict(state.get("buffers", {})).items()}
    for n, packet in dict(state.get("buffers_int8", {})).items():
        out.update({f"outer8.{n}.{k}": v for k, v in dict(packet).items() if isinstance(v, torch.Tensor)})
    return out


def shared_digest(trainer: Trainer) -> str:
    """``param_digest`` of everything ``trainer``'s peers must agree on and a newcomer adopts as
    shared: the shared parameters and the outer optimizer's state."""
    return param_digest(
        {**shared_parameters(trainer.strategy, trainer.model), **outer_state_tensors(trainer.strategy)}
    )


#: the largest step count a donor's state may name
MAX_STEP = 1 << 48
#: a donor's local weights are taken only within this RMS distance of its anchor, relative to the
#: anchor's RMS, plus :data:`LOCAL_DRIFT_ABS`; else they are rebuilt from the anchor
LOCAL_DRIFT_REL = 0.5
LOCAL_DRIFT_ABS = 0.1


def own_settings(strategy: Strategy, state: Any) -> Any:
    """A donor's strategy state with this peer's own hyper-parameters (outer lr, momentum, Nesterov:
    from the run's config, never from a donor) and its own per-peer codec state (error feedback)."""
    if not isinstance(state, Mapping):
        return state
    out = dict(state)
    outer = getattr(getattr(strategy, "store", None), "outer", None)
    if isinstance(out.get("outer"), Mapping) and outer is not None:
        mine = {"lr": float(outer.lr), "momentum": float(outer.momentum), "nesterov": bool(outer.nesterov)}
        out["outer"] = {**out["outer"], **mine}
    compressor = getattr(strategy, "compressor", None)
    if "compressor" in out and compressor is not None:
        from optimizers.base import compressor_state

        out["compressor"] = compressor_state(compressor)
    return out


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt()) if t.numel() else 0.0


def local_weights(
    strategy: Strategy, parameters: dict[str, torch.Tensor], strategy_state: Any
) -> tuple[dict[str, torch.Tensor], bool]:
    """The donor's local weights (per-peer: no digest covers them) when each lies within the local
    drift bound of the donor's anchor (which the digest covers), else the anchor itself; returns
    ``(weights, rebuilt)``. Strategies without global parameters share the model's own (returned)."""
    anchor = strategy_state.get("anchor") if isinstance(strategy_state, Mapping) else None
    if not isinstance(strategy, GlobalParameters) or not isinstance(anchor, Mapping):
        return parameters, False
    fits = {n: a for n, a in anchor.items() if isinstance(a, torch.Tensor)}
    if any(n not in fits or fits[n].shape != w.shape for n, w in parameters.items()):
        return parameters, False  # the strategy's own checks refuse such a state
    for n, w in parameters.items():
        a = fits[n]
        if not _rms(w.float() - a.float()) <= LOCAL_DRIFT_REL * _rms(a) + LOCAL_DRIFT_ABS:  # NaN too
            logger.warning("the donor's local weights stray from its anchor (%s): rebuilt from the anchor", n)
            return {m: fits[m].to(parameters[m].dtype) for m in parameters}, True
    return parameters, False


def state_snapshot(trainer: Trainer, round_id: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What a donor serves: model parameters, the strategy's state, step and round number."""
    tensors = {_MODEL + n: p.detach().to("cpu", copy=True) for n, p in trainer.model.named_parameters()}
    strat_tensors, skeleton = pack_state(trainer.strategy.state_dict(), prefix="strategy")
    tensors.update(strat_tensors)
    opt_tensors, opt_skeleton = pack_state(trainer.optimizer.state_dict(), prefix="optimizer")
    tensors.update(opt_tensors)
    from peers.dht.node import dht_time

    meta = {
        "time": dht_time(),  # when it was taken: a newcomer's measure of how far behind it starts
        "round": int(round_id),
        "step": int(trainer.step),
        "strategy_name": trainer.strategy.name,
        "strategy": skeleton,
        "optimizer_kind": trainer.config.train.optimizer,
        "optimizer": opt_skeleton,
    }
    return tensors, meta


def apply_state(trainer: Trainer, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> int:
    """Load a downloaded state into ``trainer``; returns the round number to adopt.

    Raises:
        ProtocolError: the state does not fit this peer (another strategy, a bad step or round, tensors
            of another model, a strategy state that does not load); the trainer is left as it was.
    """
    if meta.get("strategy_name") != trainer.strategy.name:
        raise ProtocolError(
            f"donor runs strategy {meta.get('strategy_name')!r}, this peer {trainer.strategy.name!r}"
        )
    step, rnd = meta.get("step"), meta.get("round")
    if (
        not isinstance(step, int)
        or not isinstance(rnd, int)
        or not (0 <= step <= MAX_STEP and 0 <= rnd <= MAX_ROUND)
    ):
        raise ProtocolError("state meta lacks a valid step and round")
    kind = trainer.config.train.optimizer
    take_optimizer = "optimizer" in meta
    if take_optimizer and meta.get("optimizer_kind") != kind:
        # the parameters and the strategy state still fit: keep this peer's own inner state
        logger.warning(
            "the donor's inner optimizer is %r, this peer's %r: keeping this peer's own optimizer state",
            meta.get("optimizer_kind"),
            kind,
        )
        take_optimizer = False
    parameters = {n[len(_MODEL) :]: t for n, t in tensors.items() if n.startswith(_MODEL)}
    try:
        strategy_state = own_settings(trainer.strategy, unpack_state(meta.get("strategy"), tensors))
        parameters, rebuilt = local_weights(trainer.strategy, parameters, strategy_state)
        take_optimizer = take_optimizer and not rebuilt  # inner state that went with those weights
        optimizer_state = unpack_state(meta["optimizer"], tensors) if take_optimizer else None
        trainer.load_peer_state(parameters, strategy_state, step, optimizer_state)
    except CheckpointError as e:
        raise ProtocolError(f"downloaded state: {e}") from None
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:  # a malformed state
        raise ProtocolError(f"downloaded state: {type(e).__name__}: {e}") from None
    return rnd


def adopt_swarm_state(
    node: Any,
    trainer: Trainer,
    collective: Any,
    timeout: float,
    *,
    wait_for_donor: float = 0.0,
    min_round: int = 0,
    fresh_wait: float = 0.0,
) -> tuple[str, float, str | None] | None:
    """Download the run's state from a donor this peer has not banned and load it into ``trainer``
    (``peers.download_state`` says what ``min_round``/``fresh_wait`` do). The collective's round number
    never goes back: a donor's snapshot can name a round whose group has formed since, and re-joining
    it would only be late again. Returns the donor's peer ID, the state's age (seconds since the
    donor took it, 0 when it does not say) and the shared digest this peer may vouch for in turn
    (:func:`vouchable`), or None (logged) when no usable state came; nothing changed then.
    """
    from peers import download_state
    from peers.state.state_transfer import NoStateAnnounced

    adopted: list[tuple[int, str | None]] = []  # (round, vouched digest) of the state loaded

    def take(tensors: dict[str, torch.Tensor], meta: dict[str, Any], vouched: bytes | None) -> None:
        """Load the state; when the donors vouched for a digest, it must be this state's (else the
        trainer goes back to what it had and the donor is skipped)."""
        before = state_snapshot(trainer, collective.round_id) if vouched is not None else None
        rnd = apply_state(trainer, tensors, meta)
        if before is not None and vouched is not None and shared_digest(trainer) != vouched.hex():
            apply_state(trainer, *before)
            raise ProtocolError("the donor's state is not the one the donors vouched for")
        adopted.append((rnd, vouched.hex() if vouched is not None else None))

    try:
        _, meta = download_state(
            node,
            timeout,
            wait_for_donor=wait_for_donor,
            min_round=min_round,
            fresh_wait=fresh_wait,
            exclude=collective.banned,
            vouchers=trainer.config.peers.state_vouchers,
            check=take,
        )
        rnd, digest = adopted[-1]
        same_round = rnd >= collective.round_id
        skip_rounds(trainer, collective.round_id - rnd)  # its step count in step with the rounds
        collective.round_id = max(rnd, collective.round_id)
    except NoStateAnnounced:  # the run's first peer: nothing to act on
        logger.info("no peer of the run announced a state: this peer starts from its own")
        return None
    except (PeerTimeoutError, ProtocolError) as e:
        logger.warning("no usable state from the swarm (%s)", e)
        return None
    vouch = digest if same_round and vouchable(meta, trainer.config.peers.state_vouchers) else None
    return str(meta["donor"]), state_age(meta), vouch


def vouchable(meta: Mapping[str, Any], vouchers: int) -> bool:
    """Whether a downloaded state may be vouched for by the peer that took it: at least two distinct
    donors, and at least ``vouchers``, vouched for its round and digest (``meta["vouched_by"]``, counted
    by the downloader). Then one more voucher adds no trust that was not there, and a state whose
    committers left stays adoptable for the next newcomer; a state one donor alone vouched for is never
    passed on as vouched."""
    n = meta.get("vouched_by")
    return isinstance(n, int) and not isinstance(n, bool) and n >= max(2, vouchers)


def adopt_saved_state(
    node: Any, trainer: Trainer, collective: Any, saved: SavedState, *, wait_for_donor: float = 0.0
) -> bool:
    """Load this peer's own saved state (``swarmtrain.app.peer.saved_state``) when it is the freshest state
    the run's donors vouch for: same round, same shared-parameter digest, by the rules a download is
    taken by. The loaded parameters must hash to that digest (else the trainer goes back to what it
    had). Returns True when loaded; False (nothing changed) when the donors vouch for another state,
    none announced one within ``wait_for_donor`` seconds, or the saved state does not load (warned).
    """
    from peers.state.state_transfer import freshest_vouched

    best = freshest_vouched(
        node,
        wait_for_donor=wait_for_donor,
        exclude=collective.banned,
        vouchers=trainer.config.peers.state_vouchers,
    )
    if best != (saved.round, bytes.fromhex(saved.digest)):
        logger.info(
            "the saved state of round %d is not the freshest the donors vouch for (%s): downloading",
            saved.round,
            "none" if best is None else f"round {best[0]}",
        )
        return False
    before = state_snapshot(trainer, collective.round_id)
    try:
        rnd = apply_state(trainer, saved.tensors, saved.meta)
    except ProtocolError as e:
        logger.warning("ignoring the saved state: it does not load (%s)", e)
        return False
    if shared_digest(trainer) != saved.digest:
        apply_state(trainer, *before)
        logger.warning("ignoring the saved state: its parameters do not hash to its digest")
        return False
    collective.round_id = max(rnd, collective.round_id)
    return True


def newer_state_round(node: Any, collective: Any, vouchers: int, wait: float = 0.0) -> int | None:
    """The round of a state the run's donors committed after the one this peer holds (its
    collective's round number), or None: checked before the peer moves its round number up to the
    run's (``PeerLoop._align_round``). Moving up over an older state joins the others' next round with
    its old shared state (DiLoCo's anchor), and every round after commits another digest than
    theirs: a newcomer that took round 4's state while the others committed round 4 did so
    (``test_join``). Rounds that failed change no state: then nothing is newer and moving up is
    right. A donor stores its certificate before it publishes its new round, but the round is
    certified only once enough of its members stored theirs: looked for again for up to ``wait``
    seconds."""
    deadline = time.monotonic() + wait
    while True:
        best = _freshest(node, collective, vouchers)
        if best is not None and best[0] > collective.round_id:
            return best[0]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def holds_the_freshest(node: Any, trainer: Trainer, collective: Any, vouchers: int) -> bool:
    """Whether the freshest state the donors vouch for has this peer's own shared parameters: no
    round committed since it got them, so a download after a failed round would only throw away its
    steps since then (and set its step count back: a restarted peer that did so after every failed
    round ended the run steps behind the others, which finished first while it committed rounds
    without them)."""
    best = _freshest(node, collective, vouchers)
    return best is not None and best[1].hex() == shared_digest(trainer)


def _freshest(node: Any, collective: Any, vouchers: int) -> tuple[int, bytes] | None:
    """``freshest_vouched`` from the donors this peer has not banned (None: none, or a failed read)."""
    from peers.state.state_transfer import freshest_vouched

    try:
        return freshest_vouched(node, exclude=collective.banned, vouchers=vouchers)
    except SwarmError:
        return None
