"""``swarmtrain doctor``'s pure parts: the verdict, reachability's classification, the table, and the
probe protocol's bounds (the server's handler driven with in-memory streams)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from peers.dht.probe import (
    MAX_DOWNLOAD,
    MAX_ECHO,
    MAX_REQUEST,
    MAX_STREAM_BYTES,
    PROBE_BYTES_PER_MINUTE,
    PROBE_TOTAL_PER_MINUTE,
    ProbeServer,
    encode_download,
    encode_echo,
    parse_request,
)
from peers.wire.budgets import RequesterBudget
from peers.wire.ledger import ByteLedger
from swarmtrain.app.doctor.reachability import Seen, classify, is_public_maddr
from swarmtrain.app.doctor.result import Check
from swarmtrain.app.doctor.verdict import decide, format_report, report_dict
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.jsonsafe import dumps

# --- probe protocol ---------------------------------------------------------------------------------


def test_requests_round_trip_and_bounds() -> None:
    assert parse_request(encode_echo(b"x" * MAX_ECHO)) == ("echo", MAX_ECHO)
    assert parse_request(encode_download(MAX_DOWNLOAD)) == ("download", MAX_DOWNLOAD)
    with pytest.raises(ValueError):
        encode_echo(b"x" * (MAX_ECHO + 1))
    for n in (0, MAX_DOWNLOAD + 1):
        with pytest.raises(ValueError):
            encode_download(n)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"E" + b"x" * MAX_REQUEST,  # over the request size
        b"D" + struct.pack(">I", 0),
        b"D" + struct.pack(">I", MAX_DOWNLOAD + 1),
        b"D" + struct.pack(">I", 5) + b"\0",  # trailing byte
        b"D\0\0",
        b"Z1234",
    ],
)
def test_bad_requests_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_request(body)


class _Writer:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, b: Any) -> None:
        self.data += bytes(b)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class _Admitted:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    async def acheck(self, peer: str) -> bool:
        return self.ok


class _Node:
    def __init__(self, admitted: bool) -> None:
        self.admitted = _Admitted(admitted)
        self.ledger = ByteLedger()


class _Info:
    class peer_id:  # noqa: N801 - mimics hivemind's PeerID
        @staticmethod
        def to_base58() -> str:
            return "12D3KooWtest"


def _frame(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _serve(requests: list[bytes], admitted: bool = True) -> tuple[_Writer, _Node]:
    server = object.__new__(ProbeServer)
    node = _Node(admitted)
    server.node, server.name, server.active, server.served = node, "t", 0, 0
    server.budget = RequesterBudget(PROBE_BYTES_PER_MINUTE, PROBE_TOTAL_PER_MINUTE)

    async def go() -> _Writer:
        reader = asyncio.StreamReader()
        for r in requests:
            reader.feed_data(_frame(r))
        reader.feed_eof()
        writer = _Writer()
        await server._handle(_Info(), reader, writer)
        return writer

    return asyncio.run(go()), node


def test_server_echoes_and_downloads() -> None:
    w, node = _serve([encode_echo(b"ping"), encode_download(1000)])
    assert bytes(w.data) == _frame(encode_echo(b"ping")) + _frame(bytes(1000))
    assert w.closed
    assert node.ledger.sent == len(w.data)


def test_server_refuses_peers_not_admitted() -> None:
    w, _ = _serve([encode_echo(b"ping")], admitted=False)
    assert w.data == b"" and w.closed


def test_server_caps_a_streams_download_total() -> None:
    asks = MAX_STREAM_BYTES // MAX_DOWNLOAD + 1
    w, _ = _serve([encode_download(MAX_DOWNLOAD)] * asks)
    assert len(w.data) <= MAX_STREAM_BYTES + 4 * asks  # the request over the cap got nothing
    assert w.closed


def test_server_stops_at_a_bad_request() -> None:
    w, _ = _serve([b"Zzz", encode_echo(b"late")])
    assert w.data == b""


# --- reachability -----------------------------------------------------------------------------------


def _seen(**kw: Any) -> Seen:
    base: dict[str, Any] = dict(asked=True, public_peers=True, autonat=None, maddrs=(), waited_s=20.0)
    return Seen(**{**base, **kw})


def test_reachability_is_unknown_unless_something_proves_it() -> None:
    assert classify(_seen(asked=False))[0] == "unknown"
    assert classify(_seen(public_peers=False)) == ("unknown", "no public peers to ask")
    assert classify(_seen())[0] == "unknown"
    assert classify(_seen(maddrs=("/ip4/8.8.8.8/tcp/1",)))[0] == "unknown"  # an address proves nothing
    assert classify(_seen(autonat="public"))[0] == "public"
    assert classify(_seen(autonat="private"))[0] == "behind NAT"
    relay = "/ip4/8.8.8.8/tcp/1/p2p/QmRelay/p2p-circuit"
    assert classify(_seen(autonat="private", maddrs=(relay,)))[0] == "relayed"
    assert classify(_seen(error="boom", autonat="public"))[0] == "unknown"


def test_public_maddrs() -> None:
    assert is_public_maddr("/ip4/8.8.8.8/tcp/4001/p2p/Qm")
    assert is_public_maddr("/dns4/boot.example.org/tcp/4001")
    assert not is_public_maddr("/ip4/127.0.0.1/tcp/4001")
    assert not is_public_maddr("/ip4/192.168.1.2/tcp/4001")
    assert not is_public_maddr("/ip6/::1/tcp/4001")
    assert not is_public_maddr("/ip4/not-an-ip/tcp/1")


# --- verdict ----------------------------------------------------------------------------------------


def _mem(cpu: bool, gpu: bool | None = None) -> Check:
    status = "ok" if cpu or gpu else "fail"
    return Check("memory", status, "-", "m", {"cpu_fits": cpu, "gpu_fits": gpu})  # type: ignore[arg-type]


def _thr(dev: str, tok_s: float = 5000.0, step_s: float = 0.2, status: str = "ok") -> Check:
    return Check(f"throughput {dev}", status, "5k tok/s", "", {"tokens_per_s": tok_s, "step_s": step_s})  # type: ignore[arg-type]


DAEMON = Check("p2p daemon", "ok", "0.1 s")


def test_verdict_roles() -> None:
    assert decide([DAEMON, _thr("cpu"), _thr("cuda"), _mem(True, True)]).role == "trainer"
    assert decide([DAEMON, _thr("cpu"), _mem(True)]).role == "trainer (CPU)"
    assert decide([DAEMON, _thr("cpu", step_s=3.0), _mem(True)]).role == "trainer (CPU, slow)"
    slow = decide([DAEMON, _thr("cpu", tok_s=100.0), _mem(True)], peer_throughput=[5000.0, 9000.0])
    assert slow.role == "trainer (CPU, slow)" and slow.exit_code == 0
    fast = decide([DAEMON, _thr("cpu", tok_s=4000.0, step_s=3.0), _mem(True)], peer_throughput=[5000.0])
    assert fast.role == "trainer (CPU)"  # the run's own figures beat the absolute rule


def test_verdict_without_memory_or_daemon() -> None:
    v = decide([DAEMON, _thr("cpu", status="fail"), _mem(False)])
    assert v.role == "not enough memory" and v.exit_code == 1
    public = Check("reachability", "ok", "public", "", {"answer": "public"})
    assert decide([DAEMON, public, _thr("cpu", status="fail"), _mem(False)]).role == "relay-only"
    dead = decide([Check("p2p daemon", "fail", "-", "p2pd missing"), _thr("cpu"), _mem(True)])
    assert dead.role == "cannot join" and dead.exit_code == 1
    nodht = decide([DAEMON, Check("dht", "fail", "-", "no answer"), _thr("cpu"), _mem(True)])
    assert nodht.role == "cannot join"


def test_skips_and_warnings_are_not_failures() -> None:
    checks = [
        DAEMON,
        Check("reachability", "warn", "unknown", "no public peers to ask", {"answer": "unknown"}),
        Check("dht", "skip", "-", "skipped: no --initial-peers"),
        _thr("cpu"),
        _mem(True),
    ]
    assert decide(checks).exit_code == 0


def test_report_fits_80_columns_and_json_has_no_nan() -> None:
    long = "x" * 300
    checks = [
        DAEMON,
        Check("peer abcdefgh", "ok", "0.3 ms", long, {"rtt_s": float("nan")}),
        _thr("cpu"),
        _mem(True),
    ]
    v = decide(checks)
    text = format_report(checks, v)
    assert all(len(line) < 80 for line in text.splitlines())
    assert "verdict: trainer (CPU)" in text
    out = dumps(report_dict(checks, v, run_id="r"))
    assert "NaN" not in out and '"role": "trainer (CPU)"' in out
