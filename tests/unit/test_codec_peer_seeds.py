"""Issue 32: every peer's codec draws its own random numbers.

Before the fix every peer built its codec with seed 0, so a random-draw codec (ternary) rounded the
same tensor the same way on every peer: the quantisation noise was identical across peers and the
average kept all of it instead of shrinking it by ~1/sqrt(N). Each peer's seed is now
``compression.peer_seed(run seed, rank or peer ID)``, on the harness's and the peer loop's path
(``Trainer``) and on ``swarmtrain.connect``'s.
"""

from __future__ import annotations

import torch

import compression
from compression import peer_seed
from optimizers import InProcessGroup, StrategyContext
from optimizers.base import make_compressor
from swarmtrain.core.config import CompressionConfig, strategy_config

TERNARY = CompressionConfig(codec="ternary")


def _tensor() -> torch.Tensor:
    return torch.randn(8192, generator=torch.Generator().manual_seed(7))


def _peer_codecs(n: int, *, own: bool) -> list[compression.Codec]:
    """The codecs ``n`` peers send through, built as a strategy builds them (``make_compressor``)."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctxs = [
        StrategyContext(
            model, opt, strategy_config("diloco"), TERNARY, codec_seed=3, codec_peer=i if own else None
        )
        for i in range(n)
    ]
    return [make_compressor(ctx) for ctx in ctxs]


def test_peer_seed_is_deterministic_and_differs_per_peer() -> None:
    seeds = {peer_seed(0, i) for i in range(64)} | {peer_seed(1, i) for i in range(64)}
    assert len(seeds) == 128
    assert peer_seed(5, 3) == peer_seed(5, 3) and 0 <= peer_seed(5, 3) < 2**32
    assert peer_seed(0, 1) != peer_seed(0, "1")  # a rank and a peer ID never collide by spelling


def test_two_peers_ternary_draws_of_one_tensor_differ() -> None:
    a, b = _peer_codecs(2, own=True)
    x = _tensor()
    pa, pb = a.compress(x, key="w"), b.compress(x, key="w")
    assert not torch.equal(a.decompress(pa), b.decompress(pb))
    # the shared-seed default (no peer) is what every peer used before: identical draws
    c, d = _peer_codecs(2, own=False)
    assert torch.equal(c.decompress(c.compress(x, key="w")), d.decompress(d.compress(x, key="w")))


def test_mean_of_peers_ternary_encodings_is_more_accurate_with_own_seeds() -> None:
    x, n = _tensor(), 8

    def mean_error(codecs: list[compression.Codec]) -> float:
        mean = torch.stack([c.decompress(c.compress(x, key="w")) for c in codecs]).mean(0)
        return float((mean - x).norm() / x.norm())

    own, shared = mean_error(_peer_codecs(n, own=True)), mean_error(_peer_codecs(n, own=False))
    # independent noise averages down by ~1/sqrt(8) = 0.35; identical noise does not at all
    assert own < 0.5 * shared, (own, shared)


def test_seed_option_is_the_runs_seed_and_still_per_peer() -> None:
    cfg = CompressionConfig(codec="ternary", options={"seed": 11})
    codecs = [compression.build_compressor(cfg, peer=i) for i in range(2)]
    assert [getattr(c, "seed", None) for c in codecs] == [peer_seed(11, 0), peer_seed(11, 1)]


def test_trainer_gives_each_harness_worker_its_own_codec_seed() -> None:
    """The harness's and the peer loop's path: ``Trainer`` seeds its codec from (data seed, rank)."""
    from swarmtrain.app.bench.strategies import load_point
    from swarmtrain.app.train.trainer import Trainer

    cfg = load_point(None, {"compression.codec": "ternary", "model.preset": "tiny"}, env={})
    group = InProcessGroup(2)
    trainers = [Trainer(cfg, collective=group[i], peer_index=i, num_peers=2, data_seed=40) for i in range(2)]
    try:
        seeds = [trainers[i].strategy.compressor.seed for i in range(2)]  # type: ignore[attr-defined]
    finally:
        for t in trainers:
            t.close()
    assert seeds == [peer_seed(40, 0), peer_seed(40, 1)]


def test_connect_seeds_its_codec_from_its_peer_id() -> None:
    """``swarmtrain.connect``'s path (one real node on 127.0.0.1): the codec's seed is the peer ID's."""
    import swarmtrain

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with swarmtrain.connect(
        model, opt, run_id="codec-seed-test", compression="ternary", host="127.0.0.1"
    ) as peer:
        seed = peer.strategy.compressor.seed  # type: ignore[attr-defined]
        assert seed == peer_seed(0, peer.peer_id) != 0
