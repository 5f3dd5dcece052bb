"""``swarmtrain.connect``: a user's own model and optimizer, trained with a strategy over a real peer.

The peer loop (``swarmtrain.app.peer.loop``) trains the project's GPT through the ``Trainer``; a
researcher with their own ``torch.nn.Module`` and training loop needs only the networked part of it:
a ``PeerNode`` joined to a run (hivemind DHT + libp2p), a ``P2PCollective`` over it and a strategy
(DiLoCo by default) built from validated options. :func:`connect` wires those three together the way
the peer loop does and hands back a :class:`SwarmPeer` whose ``step()`` replaces ``optimizer.step()``::

    torch.manual_seed(0)  # every peer must start from the same parameters
    model, opt = MyNet(), torch.optim.AdamW(...)
    with swarmtrain.connect(model, opt, run_id="mine", initial_peers=maddrs, inner_steps=50) as peer:
        for x, y in batches:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            report = peer.step(tokens=len(x))  # the inner step, and every H steps the outer sync

What it leaves out on purpose (the peer loop has them): state download for a peer joining a run in
progress, state serving, catch-up after a missed round, preemption hand-off, owner checks. Peers of
one ``connect`` run start together from identical parameters and make the same number of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ValidationError

from swarmtrain.core.config import CompressionConfig, PeersConfig, format_validation_error, strategy_config
from swarmtrain.core.errors import ConfigError

if TYPE_CHECKING:
    from peers.dht.node import PeerNode
    from peers.rounds.collective import P2PCollective
    from swarmtrain.core.protocols import StepReport, Strategy

__all__ = ["SwarmPeer", "connect"]


class SwarmPeer:
    """A started peer that trains one model with one strategy; a context manager (closing stops it).

    Attributes:
        node: the ``PeerNode`` (DHT + libp2p daemon, peer record, byte ledger).
        collective: the ``P2PCollective`` the strategy syncs through.
        strategy: the strategy (``DiLoCo`` by default); it owns the inner optimizer's step.
        model: the user's model.
    """

    def __init__(
        self, node: PeerNode, collective: P2PCollective, strategy: Strategy, model: torch.nn.Module
    ) -> None:
        self.node, self.collective, self.strategy, self.model = node, collective, strategy, model
        self._closed = False

    @property
    def peer_id(self) -> str:
        """This peer's base58 libp2p ID."""
        return self.node.peer_id

    @property
    def maddrs(self) -> list[str]:
        """Multiaddrs other peers pass as ``initial_peers`` to join this one's run."""
        return list(self.node.visible_maddrs)

    def step(self, tokens: int = 1) -> StepReport:
        """Call after ``loss.backward()`` instead of ``optimizer.step()``: the strategy steps the inner
        optimizer and, when its schedule says so, syncs with the run's peers (a blocking round).

        Args:
            tokens: how much data this step saw (samples or tokens); DiLoCo weights each peer's
                pseudo-gradient by it.

        Returns:
            The strategy's report: ``synced``, ``committed``, ``participants``, bytes sent/received.
        """
        if self._closed:
            raise ConfigError("this peer is closed")
        return self.strategy.step(int(tokens))

    def digest(self) -> str:
        """SHA-256 (hex) of the parameters the run's peers agree on (DiLoCo's global parameters):
        equal on every peer after the same committed rounds."""
        from swarmtrain.app.peer.state import param_digest, shared_parameters

        return param_digest(shared_parameters(self.strategy, self.model))

    def close(self) -> None:
        """Stop the strategy, the collective and the node (record withdrawn, p2pd stopped). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.strategy.close()
            self.collective.close()
        finally:
            self.node.shutdown()

    def __enter__(self) -> SwarmPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    run_id: str,
    initial_peers: Sequence[str] = (),
    strategy: str = "diloco",
    compression: str | CompressionConfig = "int8",
    min_peers: int = 1,
    expected_peers: int | None = None,
    host: str = "0.0.0.0",
    port: int = 0,
    **strategy_options: Any,
) -> SwarmPeer:
    """Start a peer of run ``run_id`` and give ``model``/``optimizer`` a strategy that syncs through it.

    Everything is validated before the node starts, so a bad option costs no daemon.

    Args:
        model: the user's model; every peer must build it with the same initial parameters.
        optimizer: the inner optimizer over ``model``'s parameters (the strategy calls its ``step``).
        run_id: the run's name; peers of one run meet in its rounds.
        initial_peers: multiaddrs of any live peer of the run (empty: this peer starts it).
        strategy: a registered strategy name (``diloco``, ``streaming_diloco``, ``demo``, ...).
        compression: a codec name (``none``, ``fp16``, ``int8``, ``int4``, ``ternary``, ...) or a full
            ``CompressionConfig`` (block size, error feedback...).
        min_peers: a round is not formed with fewer peers (it waits up to the strategy's
            ``sync_timeout``).
        expected_peers: a round closes as soon as this many joined (``None``: its leader waits the
            join window for more).
        host: IPv4 address to listen on (``127.0.0.1`` for peers on one machine).
        port: TCP port (0: one the OS picks).
        **strategy_options: the strategy's own options, e.g. ``inner_steps``, ``outer_lr``,
            ``sync_timeout`` for DiLoCo (``swarmtrain.core.config.DiLoCoConfig``).

    Returns:
        The started :class:`SwarmPeer`; close it (or use it as a context manager).

    Raises:
        ConfigError: an unknown strategy or codec, an option the strategy does not have, a bad value.
        SwarmError: the node did not start (e.g. no initial peer answered).
    """
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port} is not in 0..65535")
    if expected_peers is not None and expected_peers < min_peers:
        raise ConfigError(f"expected_peers ({expected_peers}) must be >= min_peers ({min_peers})")
    options = strategy_config(strategy, **strategy_options)
    comp_cfg, peers_cfg = _configs(run_id, initial_peers, compression, min_peers, f"/ip4/{host}/tcp/{port}")
    return _start(model, optimizer, options, comp_cfg, peers_cfg, expected_peers)


def _configs(
    run_id: str,
    initial_peers: Sequence[str],
    compression: str | CompressionConfig,
    min_peers: int,
    host_maddr: str,
) -> tuple[CompressionConfig, PeersConfig]:
    """:func:`connect`'s arguments as the codec's and the peer's validated config sections."""
    try:
        comp_cfg = (
            compression
            if isinstance(compression, CompressionConfig)
            else CompressionConfig(codec=compression)
        )
        peers_cfg = PeersConfig(
            run_id=run_id,
            initial_peers=list(initial_peers),
            host_maddrs=[host_maddr],
            min_peers=min_peers,
        )
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None
    return comp_cfg, peers_cfg


def _start(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    options: Any,
    comp_cfg: CompressionConfig,
    peers_cfg: PeersConfig,
    expected_peers: int | None,
) -> SwarmPeer:
    """Start the node, then the collective and the strategy over it (as the peer loop does); a
    failure after the node started shuts it down."""
    from compression import build_compressor
    from optimizers import StrategyContext, build_strategy
    from peers import P2PCollective, PeerNode
    from peers.reducers import build_reducer

    build_compressor(comp_cfg)  # a bad codec option is refused before the node starts
    reducer = build_reducer(peers_cfg.reducer, peers_cfg.byzantine_f, **peers_cfg.reducer_options)
    node = PeerNode(peers_cfg, role="trainer")  # as the peer loop starts its node
    try:
        # each peer its own codec draws, from its peer ID (it has no rank): peer_seed(run seed, ID)
        compressor = build_compressor(comp_cfg, peer=node.peer_id)
        collective = P2PCollective(
            node,
            min_peers=peers_cfg.min_peers,
            expected_peers=expected_peers,
            join_window=peers_cfg.join_window,
        )
        ctx = StrategyContext(model, optimizer, options, comp_cfg, collective, reducer, compressor)
        return SwarmPeer(node, collective, build_strategy(ctx), model)
    except BaseException:
        node.shutdown()
        raise
