"""Each attack does what it claims, and the robust reducers withstand it where the mean does not."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import pytest
import torch

from peers.reducers import build_reducer
from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.attacks import ATTACKS, build_attack, flip_labels, forge_rows
from swarmtrain.simulation.attacks.update import alie_z

ROBUST = ["coordinate_median", "trimmed_mean", "centered_clip", "multi_krum", "krum", "geometric_median"]


def _honest(n: int, m: int = 400, sigma: float = 0.1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` honest updates ``mu + sigma * noise`` (high signal-to-noise, like DiLoCo pseudo-gradients)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(m, generator=g, dtype=torch.float64)
    return mu + sigma * torch.randn(n, m, generator=g, dtype=torch.float64), mu


# ---- each attack's own claim -----------------------------------------------------------------------


def test_sign_flip_and_random_direction() -> None:
    own = torch.randn(50, dtype=torch.float64)
    torch.testing.assert_close(build_attack("sign_flip", scale=3.0).forge(own), -3.0 * own)
    a, b = build_attack("random_direction", scale=5.0, seed=7), build_attack("random_direction", seed=7)
    x, y = a.forge(own), b.forge(2 * own)
    assert math.isclose(float(x.norm()), 5.0 * float(own.norm()), rel_tol=1e-9)
    # Attackers with one seed push along the same direction, whatever their own update.
    assert math.isclose(float(x @ y) / float(x.norm() * y.norm()), 1.0, rel_tol=1e-9)
    assert torch.equal(a.forge(own), x)  # fixed across rounds
    assert not torch.allclose(build_attack("random_direction", seed=8).forge(own), x)


def test_gaussian_noise_has_the_claimed_scale_and_no_signal() -> None:
    own = torch.randn(20000, dtype=torch.float64) + 3.0
    out = build_attack("gaussian_noise", scale=2.0).forge(own, generator=torch.Generator().manual_seed(1))
    rms = float(own.square().mean().sqrt())
    assert abs(float(out.std()) / (2.0 * rms) - 1.0) < 0.03
    assert abs(float(out.mean())) < 0.1 * rms
    assert abs(float(torch.corrcoef(torch.stack([out, own]))[0, 1])) < 0.05


def test_alie_z_matches_the_paper_formula() -> None:
    # n=50, f=12 in Baruch et al.: s = 26 - 12 = 14, z = Phi^-1(36/50) ~ 0.58
    assert math.isclose(alie_z(50, 12), NormalDist().inv_cdf(36 / 50))
    assert math.isclose(alie_z(16, 7), NormalDist().inv_cdf(14 / 16))
    assert math.isclose(alie_z(8, 3), NormalDist().inv_cdf(6 / 8))
    with pytest.raises(ConfigError):
        alie_z(8, 0)


def test_alie_stays_within_mean_plus_minus_z_std() -> None:
    honest, _ = _honest(9)
    attack = build_attack("alie", n_peers=16, n_byzantine=7)
    out = attack.forge(honest[0], honest)
    mean, std = honest.mean(0), honest.std(0, correction=0)
    z = attack.z  # type: ignore[attr-defined]
    assert bool((out >= mean - z * std - 1e-12).all()) and bool((out <= mean + z * std + 1e-12).all())
    torch.testing.assert_close(out, mean - z * std)
    with pytest.raises(ConfigError):
        attack.forge(honest[0])  # omniscient: needs the honest updates


def test_ipm_has_negative_inner_product_with_the_honest_mean() -> None:
    honest, _ = _honest(9, seed=3)
    for eps in (0.1, 0.5, 2.0):
        out = build_attack("ipm", epsilon=eps).forge(honest[0], honest)
        mean = honest.mean(0)
        assert float(out @ mean) < 0
        torch.testing.assert_close(out, -eps * mean)


def test_stale_replays_the_update_from_delay_rounds_ago() -> None:
    attack = build_attack("stale", delay=3)
    sent = [attack.forge(torch.full((4,), float(r))) for r in range(8)]
    assert [float(s[0]) for s in sent] == [0, 0, 0, 0, 1, 2, 3, 4]
    other = build_attack("stale", delay=3)  # state is per instance
    assert float(other.forge(torch.full((4,), 9.0))[0]) == 9.0


def test_label_flip_maps_bytes_and_keeps_inputs() -> None:
    x = torch.randint(0, 256, (4, 16))
    y = torch.arange(256).reshape(16, 16)
    attack = build_attack("label_flip")
    assert attack.data_level
    x2, y2 = attack.transform_batch(x, y)
    assert torch.equal(x2, x)
    assert torch.equal(y2, 255 - y)
    assert torch.equal(flip_labels(y2), y)  # an involution
    assert torch.equal(flip_labels(torch.tensor([-100, 0, 9]), 10), torch.tensor([-100, 9, 0]))
    own = torch.randn(10)
    assert torch.equal(attack.forge(own), own)  # the update itself is honest work on poisoned data
    with pytest.raises(ConfigError):
        flip_labels(torch.tensor([256]))
    with pytest.raises(ConfigError):
        flip_labels(torch.tensor([0.5]))


def test_malicious_owner_corrupts_the_aggregate() -> None:
    agg = torch.randn(100, dtype=torch.float64)
    assert build_attack("malicious_owner").owner_level
    torch.testing.assert_close(build_attack("malicious_owner").corrupt_aggregate(agg), -agg)
    assert not build_attack("malicious_owner", mode="zero").corrupt_aggregate(agg).any()
    rnd = build_attack("malicious_owner", mode="random", scale=2.0).corrupt_aggregate(agg)
    assert math.isclose(float(rnd.norm()), 2.0 * float(agg.norm()), rel_tol=1e-9)
    assert abs(float(rnd @ agg) / float(rnd.norm() * agg.norm())) < 0.5
    own = torch.randn(5)
    assert torch.equal(build_attack("malicious_owner").forge(own), own)  # contributes honestly
    with pytest.raises(ConfigError):
        build_attack("malicious_owner", mode="bogus")


def test_registry_and_option_errors() -> None:
    assert set(ATTACKS.names()) == {
        "none",
        "sign_flip",
        "random_direction",
        "gaussian_noise",
        "alie",
        "ipm",
        "stale",
        "label_flip",
        "malicious_owner",
        "inflated_weight",
    }
    for bad in (
        ("sign_flip", {"scale": -1.0}),
        ("ipm", {"epsilon": float("nan")}),
        ("inflated_weight", {"weight": float("inf")}),
        ("stale", {"delay": 0}),
        ("sign_flip", {"bogus": 1}),
        ("nope", {}),
    ):
        with pytest.raises(ConfigError):
            build_attack(bad[0], **bad[1])
    with pytest.raises(ConfigError):
        build_attack("sign_flip").forge(torch.randn(3, 3))


def test_forge_rows_replaces_only_attackers_and_shows_them_the_honest_rows() -> None:
    honest, _ = _honest(8, m=30)
    out = forge_rows(honest, {1: build_attack("ipm", epsilon=1.0), 5: build_attack("sign_flip", scale=1.0)})
    keep = [0, 2, 3, 4, 6, 7]
    assert torch.equal(out[keep], honest[keep])
    torch.testing.assert_close(out[1], -honest[keep].mean(0))
    torch.testing.assert_close(out[5], -honest[5])
    with pytest.raises(ConfigError):
        forge_rows(honest, {8: build_attack("sign_flip")})


# ---- reducers under each attack --------------------------------------------------------------------

UPDATE_ATTACKS = ["sign_flip", "random_direction", "gaussian_noise", "alie", "ipm", "stale"]


def _attacked(name: str, n: int, f: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """A stack with rows 0..f-1 forged by ``name`` (stale: after 12 rounds of drifting updates)."""
    honest, mu = _honest(n, seed=seed)
    opts = {"n_peers": n, "n_byzantine": f} if name == "alie" else {}
    attackers = {i: build_attack(name, **opts) for i in range(f)}
    if name == "stale":  # the honest direction rotates over rounds, so old updates point elsewhere
        for r in range(12):
            forge_rows(_honest(n, seed=100 + r)[0], attackers)
    stack = forge_rows(honest, attackers, generator=torch.Generator().manual_seed(seed))
    spread = float((honest - honest.mean(0)).norm(dim=1).max())  # largest honest distance to their mean
    return stack, honest[f:].mean(0), spread


@pytest.mark.parametrize("attack", UPDATE_ATTACKS)
@pytest.mark.parametrize(("n", "f"), [(8, 3), (16, 7)])
def test_robust_reducers_stay_near_the_honest_mean(attack: str, n: int, f: int) -> None:
    w = torch.ones(n, dtype=torch.float64)
    for name in ROBUST:
        # Each reducer at the most attackers it claims to tolerate (Krum: 2 of 8, 6 of 16).
        ff = max(x for x in range(f + 1) if n >= build_reducer(name, 0).min_peers(x))
        stack, target, spread = _attacked(attack, n, ff)
        err = float((build_reducer(name, ff).reduce(stack, w) - target).norm())
        assert err <= 3.0 * spread, f"{name} vs {attack} ({ff}/{n}): error {err:.3g}, spread {spread:.3g}"


@pytest.mark.parametrize("attack", ["sign_flip", "random_direction", "gaussian_noise", "ipm", "stale"])
@pytest.mark.parametrize(("n", "f"), [(8, 3), (16, 7)])
def test_the_mean_breaks_under_coarse_attacks_and_centered_clip_does_not(attack: str, n: int, f: int) -> None:
    stack, target, spread = _attacked(attack, n, f, seed=1)
    w = torch.ones(n, dtype=torch.float64)
    mean_err = float((build_reducer("mean").reduce(stack, w) - target).norm())
    clip_err = float((build_reducer("centered_clip", f).reduce(stack, w) - target).norm())
    assert mean_err > 5.0 * spread  # the attack bites the plain mean
    assert clip_err < mean_err / 4
    if attack == "ipm":  # the mean's aggregate now points against the honest direction
        assert float(build_reducer("mean").reduce(stack, w) @ target) < 0
        assert float(build_reducer("centered_clip", f).reduce(stack, w) @ target) > 0


# ---- AttackingCollective over the in-process collective --------------------------------------------


def _rounds_with_one_attacker(attack: str, rounds: int, **opts: float) -> list[list[torch.Tensor]]:
    """4 members in threads; member 0 attacks; returns every member's results, round by round."""
    import threading

    from compression import make_codec
    from optimizers import InProcessGroup
    from swarmtrain.simulation.attacks import AttackingCollective

    group = InProcessGroup(4, timeout=30.0)
    codec = make_codec("none")
    results: list[list[torch.Tensor]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def peer(i: int) -> None:
        coll = group.members[i] if i else AttackingCollective(group.members[0], attack, opts)
        try:
            for r in range(rounds):
                x = torch.full((2, 3), float(i + 1)) * (r + 1)
                res = coll.all_reduce({"w": x, "b": x[0] * 10}, compressor=codec)
                assert res.committed
                results[i].append(torch.cat([res.tensors["w"].reshape(-1), res.tensors["b"]]))
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=peer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def test_attacking_collective_forges_its_contribution_in_a_real_round() -> None:
    results = _rounds_with_one_attacker("sign_flip", 1, scale=4.0)
    # Peers 2, 3, 4 send 2, 3, 4; the attacker's honest 1 is sent as -4: mean (2 + 3 + 4 - 4) / 4.
    expected = torch.cat([torch.full((6,), 5 / 4), torch.full((3,), 50 / 4)])
    for got in results:
        torch.testing.assert_close(got[0], expected)


def test_attacking_collective_keeps_stale_state_per_tensor() -> None:
    results = _rounds_with_one_attacker("stale", 3, delay=2)
    # Round r: honest peers send (i+1)*(r+1); the attacker replays its round-0 value 1 (per tensor).
    for r in range(3):
        expected_w = (2 + 3 + 4) * (r + 1) / 4 + 1 / 4
        torch.testing.assert_close(results[1][r][:6], torch.full((6,), expected_w))
        torch.testing.assert_close(results[1][r][6:], torch.full((3,), 10 * expected_w))


def test_attacking_collective_refuses_attacks_that_do_not_act_on_the_update() -> None:
    from optimizers import InProcessGroup
    from swarmtrain.simulation.attacks import AttackingCollective

    member = InProcessGroup(1).members[0]
    for name in ("label_flip", "malicious_owner"):
        with pytest.raises(ConfigError):
            AttackingCollective(member, name)
    for name in ("alie", "ipm"):  # they estimate the honest updates from the colluders' own
        assert AttackingCollective(member, name).colluders.channel is None


@pytest.mark.parametrize(
    ("args", "options", "needle"),
    [
        (["--attack", "bogus"], "", "bogus"),
        (["--attack", "sign_flip", "--byzantine", "3"], "", "no honest peer"),
        (["--attack", "alie"], "n_byzantine = 3", "alie"),  # f >= n
        (["--attack", "label_flip"], "vocab_size = 1", "vocab_size"),
    ],
)
def test_simulate_refuses_bad_attack_settings_in_one_line_before_starting(
    args: list[str], options: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from swarmtrain.app.cli import run

    toml = tmp_path / "run.toml"
    toml.write_text(f"[simulation]\nattack_options = {{{options}}}\n")
    base = ["simulate", "-n", "3", "--byzantine", "1", "--reducer", "coordinate_median", "--tolerate", "1"]
    code = run([*base, *args, "--steps", "1", "--config", str(toml)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("swarmtrain: error:") and needle in err and "\n" not in err, err


def test_each_rank_gets_the_attack_hooks_its_place_calls_for() -> None:
    """Ranks 0..K-1 run the attack, the next M ranks are bad owners, the rest are honest (no hooks)."""
    from swarmtrain.core.config import load_config
    from swarmtrain.simulation.wiring import RankWiring, is_bad_owner

    cfg = load_config(
        None,
        {"simulation.attack": "sign_flip", "simulation.attackers": 2, "simulation.malicious_owners": 1},
        env={},
    )
    assert [is_bad_owner(cfg, r) for r in range(5)] == [False, False, True, False, False]
    hooks = [RankWiring(cfg, r, 5).hooks() for r in range(5)]
    assert [h.wrap_collective is not None for h in hooks] == [True, True, False, False, False]
    assert all(h.wrap_batches is None for h in hooks)
    assert hooks[2].wrap_reducer is not None and hooks[2].wrap_collective is None
    assert all(h == type(h)() for h in hooks[3:])
    flips = load_config(None, {"simulation.attack": "label_flip", "simulation.attackers": 1}, env={})
    h0 = RankWiring(flips, 0, 3).hooks()
    assert h0.wrap_batches is not None and h0.wrap_collective is None
    owners = load_config(None, {"simulation.attack": "malicious_owner", "simulation.attackers": 2}, env={})
    assert [is_bad_owner(owners, r) for r in range(4)] == [True, True, False, False]


def test_inflated_weight_sends_the_honest_update_and_claims_its_weight() -> None:
    attack = build_attack("inflated_weight")
    own = torch.randn(5)
    assert torch.equal(attack.forge(own), own)
    assert attack.claim_weight(1.0) == 1e30 and build_attack("sign_flip").claim_weight(3.0) == 3.0
