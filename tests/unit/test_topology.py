"""``simulate --topology``'s pure parts: the TOML schema (one clear line for a bad file), the address
plan (placement, addresses, delays), and the CLI's answers before anything is built (bad file, not
root: one line, exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.topology import (
    P2P_PORT,
    AddressPlan,
    load_topology,
    parse_topology,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "topologies" / "three_regions.toml"


def _two(**extra: Any) -> dict[str, Any]:
    return {
        "regions": [{"name": "a", "rtt_ms": 10}, {"name": "b", "rtt_ms": 4}],
        "links": [{"between": ["a", "b"], "rtt_ms": 80}],
        **extra,
    }


def test_example_file_parses() -> None:
    topo = load_topology(EXAMPLE)
    assert [r.name for r in topo.regions] == ["us-east", "eu-west", "ap-south"]
    assert topo.rate_mbit == 50
    assert topo.rtt_ms("us-east", "us-east") == 10
    assert topo.rtt_ms("eu-west", "us-east") == topo.rtt_ms("us-east", "eu-west") == 80
    assert topo.rtt_ms("ap-south", "us-east") == 150


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"regions": []}, "regions"),
        (_two(links=[]), "no [[links]] entry for a-b"),
        (_two(links=[{"between": ["a", "c"], "rtt_ms": 1}]), "'c' is not a region"),
        (_two(links=[{"between": ["a", "a"], "rtt_ms": 1}]), "own RTT"),
        (
            _two(links=[{"between": ["a", "b"], "rtt_ms": 1}, {"between": ["b", "a"], "rtt_ms": 2}]),
            "given twice",
        ),
        ({**_two(), "regions": [{"name": "a"}, {"name": "a"}]}, "repeat"),
        (_two(rate_mbit=-5), "rate_mbit"),
        (_two(bootstrap_region="z"), "bootstrap_region"),
        (_two(colour="red"), "colour"),
        ({**_two(), "regions": [{"name": "a b"}, {"name": "b"}]}, "name"),
        (_two(links=[{"between": ["a", "b"], "rtt_ms": -1}]), "rtt_ms"),
    ],
)
def test_bad_topologies_are_one_line(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_topology(data, "topology t.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("topology t.toml: ") and needle in msg, msg


def test_unreadable_and_non_toml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_topology(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("regions = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_topology(bad)


def test_address_plan_places_round_robin_with_distinct_addresses() -> None:
    plan = AddressPlan(load_topology(EXAMPLE), 5)
    nodes = plan.nodes
    assert [n.rank for n in nodes] == [-1, 0, 1, 2, 3, 4]
    assert [n.region for n in nodes] == ["us-east", "us-east", "eu-west", "ap-south", "us-east", "eu-west"]
    for attr in ("ns", "ip", "proxy_ip", "source_ip"):
        values = [getattr(n, attr) for n in nodes]
        assert len(set(values)) == len(values), attr
    assert all(n.ns.startswith("swr-") for n in nodes)
    # every address is in the private 10.214.0.0/16 the regions own
    assert all(getattr(n, a).startswith("10.214.") for n in nodes for a in ("ip", "proxy_ip", "source_ip"))
    peer0 = plan.node_of_rank(0)
    assert peer0.host_maddr == f"/ip4/{peer0.ip}/tcp/{P2P_PORT}"
    assert peer0.announce_maddr == f"/ip4/{peer0.proxy_ip}/tcp/{P2P_PORT}"
    assert plan.node_of_rank(-1).region == "us-east"


def test_one_way_delay_is_half_the_rtt_and_symmetric() -> None:
    plan = AddressPlan(load_topology(EXAMPLE), 4)  # peers: us-east, eu-west, ap-south, us-east
    assert plan.one_way_s(1, 2) == plan.one_way_s(2, 1) == pytest.approx(0.040)
    assert plan.one_way_s(1, 3) == pytest.approx(0.075)
    assert plan.one_way_s(1, 4) == pytest.approx(0.005)  # two peers of us-east
    assert plan.one_way_s(2, 3) == pytest.approx(0.060)


def test_region_rate_overrides_the_default() -> None:
    data = _two()
    data["regions"][1]["rate_mbit"] = 20
    plan = AddressPlan(parse_topology(data), 2)
    assert [n.rate_mbit for n in plan.nodes] == [50.0, 50.0, 20.0]
    assert "RTT 10-80 ms" in plan.describe()


def test_peer_count_is_bounded() -> None:
    topo = parse_topology(_two())
    with pytest.raises(ConfigError):
        AddressPlan(topo, 0)
    with pytest.raises(ConfigError):
        AddressPlan(topo, 500)


def test_cli_bad_topology_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from swarmtrain.app.cli import run

    bad = tmp_path / "t.toml"
    bad.write_text('[[regions]]\nname = "a"\n[[regions]]\nname = "b"\n')
    assert run(["simulate", "--peers", "2", "--topology", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no [[links]] entry for a-b" in err[0], err


def test_cli_topology_needs_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from swarmtrain.app.cli import run

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert run(["simulate", "--peers", "2", "--topology", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need root" in err[0] and "Traceback" not in err[0], err
