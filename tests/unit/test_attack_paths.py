"""The attack paths of real peers: every attack name runs under ``simulate``.

ALIE and IPM estimate the honest updates from the colluding attackers' own honest updates, shared
over a side channel (``Colluders``); label flip poisons the trainer's batches (``PoisonedBatches``).
Here the collectives are the in-process ones (threads); ``tests/integration/test_attacks_real.py``
runs the same paths with real peer processes.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from compression import make_codec
from optimizers import InProcessGroup
from swarmtrain.app.data import BatchSampler
from swarmtrain.core.config import load_config
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.simulation.attacks import (
    ATTACKS,
    AttackingCollective,
    Colluders,
    PoisonedBatches,
    build_attack,
    decode_rows,
    encode_rows,
)


@pytest.mark.parametrize("name", sorted(set(ATTACKS.names()) - {"none"}))
def test_simulate_accepts_every_attack(name: str) -> None:
    from swarmtrain.app.commands.simulate_checks import validate_names as _validate_names

    cfg = load_config(
        None,
        {
            "simulation.attack": name,
            "simulation.attackers": 2,
            "peers.reducer": "centered_clip",
            "peers.byzantine_f": 2,
        },
        env={},
    )
    _validate_names(cfg, 5)  # raises ConfigError for anything it cannot run


@pytest.mark.parametrize("name", sorted(set(ATTACKS.names()) - {"none"}))
def test_demo_refuses_attacks_that_would_do_nothing(name: str) -> None:
    """DeMo all-gathers sparse components: only the data-level label flip can act on it; every other
    attack would silently be a no-op, so the run is refused in one line instead."""
    from swarmtrain.app.commands.simulate_checks import validate_names as _validate_names
    from swarmtrain.simulation.runner import run_simulation

    cfg = load_config(
        None, {"strategy.name": "demo", "simulation.attack": name, "simulation.attackers": 1}, env={}
    )
    if name == "label_flip":
        _validate_names(cfg, 4)
        return
    with pytest.raises(ConfigError, match="cannot act on strategy 'demo'"):
        _validate_names(cfg, 4)
    with pytest.raises(ConfigError, match="cannot act on strategy 'demo'"):
        run_simulation(cfg, 4)  # refused before any process starts
    owners = load_config(None, {"strategy.name": "demo", "simulation.malicious_owners": 1}, env={})
    with pytest.raises(ConfigError, match="malicious_owner"):
        _validate_names(owners, 4)


# ---- the colluders' payload ------------------------------------------------------------------------


def test_rows_round_trip_and_refuse_anything_else() -> None:
    rows = {"w": torch.randn(12), "b": torch.randn(3)}
    expect = {"w": 12, "b": 3}
    back = decode_rows(encode_rows(rows), expect)
    assert list(back) == ["w", "b"] and all(torch.equal(back[k], rows[k]) for k in rows)
    good = encode_rows(rows)
    bad = [
        b"",
        b"\x00" * 10,
        good[:-3],
        good + b"\x00" * 4096,
        encode_rows({"b": rows["b"], "w": rows["w"]}),  # wrong order/names
        encode_rows({"w": torch.randn(11), "b": rows["b"]}),  # wrong size
        encode_rows({"w": torch.full((12,), float("nan")), "b": rows["b"]}),  # non-finite
        msgpack.packb({"v": 2, "t": []}),
        msgpack.packb([1, 2, 3]),
    ]
    for data in bad:
        with pytest.raises(ProtocolError):
            decode_rows(data, expect)
    with pytest.raises(ProtocolError):
        decode_rows(good, {"w": 12})


def _threads(n: int, fn: Any) -> list[Any]:
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def test_colluders_share_every_row_own_first() -> None:
    side = InProcessGroup(3)

    def peer(i: int) -> dict[str, torch.Tensor]:
        return Colluders(side[i]).share({"w": torch.full((2, 2), float(i))})

    got = _threads(3, peer)
    for i, rows in enumerate(got):
        assert rows["w"].shape == (3, 4)
        assert torch.equal(rows["w"][0], torch.full((4,), float(i)))
        assert sorted(rows["w"][:, 0].tolist()) == [0.0, 1.0, 2.0]


def test_a_failed_exchange_falls_back_to_the_own_row() -> None:
    side = InProcessGroup(1)
    side.fail_rounds({0})
    col = Colluders(side[0])
    rows = col.share({"w": torch.ones(3)})
    assert rows["w"].shape == (1, 3) and col.failed == 1 and col.exchanges == 1


# ---- ALIE and IPM from the colluders' estimate, in a real round ------------------------------------


def _round_with_two_colluders(name: str, **opts: float) -> tuple[list[torch.Tensor], list[int]]:
    """4 members; members 0 and 1 run ``name`` and share their updates; each member i sends i+1."""
    group, side = InProcessGroup(4), InProcessGroup(2)
    codec = make_codec("none")

    def peer(i: int) -> tuple[torch.Tensor, int]:
        coll: Any = group[i]
        if i < 2:
            coll = AttackingCollective(group[i], name, opts, colluders=Colluders(side[i]))
        x = torch.full((5,), float(i + 1))
        res = coll.all_reduce({"w": x}, compressor=codec)
        assert res.committed
        return res.tensors["w"], coll.colluders.exchanges if i < 2 else 0

    out = _threads(4, peer)
    return [t for t, _ in out], [e for _, e in out]


def test_alie_forges_mean_minus_z_std_of_the_colluders_updates() -> None:
    got, exchanges = _round_with_two_colluders("alie", z=1.5)
    # attackers' honest rows 1 and 2: mean 1.5, population std 0.5 -> forged 1.5 - 1.5 * 0.5 = 0.75
    expected = (2 * 0.75 + 3 + 4) / 4
    for t in got:
        torch.testing.assert_close(t, torch.full((5,), expected))
    assert exchanges == [1, 1, 0, 0]


def test_ipm_forges_minus_epsilon_times_the_colluders_mean() -> None:
    got, _ = _round_with_two_colluders("ipm", epsilon=2.0)
    expected = (2 * -3.0 + 3 + 4) / 4  # -2 * mean(1, 2) = -3
    for t in got:
        torch.testing.assert_close(t, torch.full((5,), expected))


def test_a_lone_ipm_attacker_uses_its_own_update() -> None:
    member = InProcessGroup(1)[0]
    coll = AttackingCollective(member, "ipm", {"epsilon": 3.0})
    res = coll.all_reduce({"w": torch.ones(4)}, compressor=make_codec("none"))
    assert res.committed and torch.equal(res.tensors["w"], torch.full((4,), -3.0))
    assert coll.colluders.exchanges == 0


# ---- label flip on the trainer's batches -----------------------------------------------------------


def test_poisoned_batches_flip_the_targets_of_the_real_sampler() -> None:
    data = np.frombuffer(bytes(range(256)) * 40, dtype=np.uint8)
    honest = BatchSampler(data, batch_size=4, block_size=16, seed=1, peer_index=1, num_peers=3)
    poisoned = PoisonedBatches(
        BatchSampler(data, batch_size=4, block_size=16, seed=1, peer_index=1, num_peers=3),
        build_attack("label_flip"),
    )
    for step in range(3):
        x, y = honest.get(step)
        px, py = poisoned.get(step)
        assert torch.equal(px, x) and torch.equal(py, 255 - y)
    assert poisoned.batches == 3
    assert poisoned.identity() == honest.identity()  # checkpoints see the same stream
    with pytest.raises(ConfigError):
        PoisonedBatches(honest, build_attack("sign_flip"))
