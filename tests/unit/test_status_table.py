"""``swarmtrain status``'s table: plain lines that fit the terminal (80 columns) without cutting a
figure; optional columns make room, in a fixed order."""

from __future__ import annotations

from peers.dht.node import dht_time
from peers.dht.records import PeerRecord
from swarmtrain.app.commands.peers import peer_table


def _rec(i: int, **kw: object) -> PeerRecord:
    base: dict[str, object] = {
        "peer_id": f"Qm{'x' * 40}{i:04d}",
        "run_id": "r",
        "role": "trainer",
        "region": "europe-west4-a",
        "step": 1_234_567,
        "round": 61_728,
        "throughput": 123_456.7,
        "loss": 2.3456,
        "version": "0.1.0",
        "bytes_sent": 3 * 1024**4,
        "bytes_received": 1023 * 1024**3,
        "time": dht_time() - 12,
        "extra": {"committed": 61_000, "late": 700, "failed": 28},
        "contributed_tokens": 81_234_567_890,
        "committed_rounds": 61_000,
    }
    base.update(kw)
    return PeerRecord(**base)  # type: ignore[arg-type]


def test_the_table_fits_80_columns_with_every_figure_whole() -> None:
    recs = [_rec(0), _rec(1, role="bootstrap", loss=float("nan"), extra={}), _rec(2, version="0.2.0")]
    lines = peer_table("r", recs, width=80)
    assert all(len(x) <= 80 for x in lines), lines
    body = "\n".join(lines)
    for figure in ("1234567", "61728", "123,457", "2.346", "3072.0 GiB", "61000/700/28", "81.2G"):
        assert figure in body, (figure, body)
    # figures this wide leave no room for bytes received: they go before a volunteer's contribution
    assert "recv" not in lines[1] and "1023.0 GiB" not in body and lines[1].split()[-1] == "tokens"
    assert "xxxx0000"[-8:] in body and "…" not in body and "..." not in body
    assert "0.1.0 on xxxx0000, xxxx0001; 0.2.0 on xxxx0002" in body  # the column went: said below
    assert "region" not in lines[1]  # the first column to go


def test_a_wide_terminal_keeps_every_column_and_one_version_is_said_once() -> None:
    lines = peer_table("r", [_rec(0), _rec(1)], width=200)
    assert lines[1].split() == [
        "peer",
        "role",
        "region",
        "step",
        "round",
        "tok/s",
        "loss",
        "sent",
        "recv",
        "ok/late/fail",
        "tokens",
        "seen",
    ]
    assert lines[-1] == "every peer runs swarmtrain 0.1.0"
    assert lines[0] == "run 'r': 2 live peer(s)"
    assert "12s" in lines[2]
