"""Fuzzing every decoder of peer bytes built on ``swarmtrain.core.safe_msgpack``: nothing but ProtocolError.

Each decoder gets arbitrary bytes, valid messages with byte-level edits (``fuzz_helpers.mutate``) and
valid messages with one field replaced or added by an arbitrary msgpack value (so the field checks
after the msgpack decode are exercised too). Whatever the input, the decoder returns or raises
``ProtocolError``; any other exception fails the test. The packet decoder itself and the codecs behind
it are fuzzed in ``test_wire_fuzz.py``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from fuzz_helpers import EDIT, Edit, mutate
from hivemind.dht.validation import DHTRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizers.demo_payload import TensorSpec, decode_payload, encode_payload
from peers.dht.dht_records import SignedRecords
from peers.dht.records import PeerRecord, decode_record, encode_record
from peers.keys.signing import Signer
from peers.state.state_transfer import decode_announcement, parse_state, serialize_state
from peers.trust.admission import Admission, RunKey, decode_token
from peers.trust.manifest import RunManifest, parse_manifest, sign_manifest
from peers.trust.suspicion import AccusationTable, decode_signed, decode_table, encode_signed
from peers.wire.messages import (
    Envelope,
    decode_ack,
    decode_envelope,
    decode_packet_bytes,
    encode_ack,
    encode_envelope,
    encode_packet_bytes,
)
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.simulation.attacks.collusion import decode_rows, encode_rows

RUN = "t-fuzz"
BATCH = 10  # inputs per hypothesis example: (40 + 40 + 25) examples -> 1,050 inputs per decoder
FUZZ = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DEMO_SPECS = [TensorSpec(4, 3, 16), TensorSpec(2, 2, 300)]
ROWS = {"w": 5, "b": 2}

Decoder = Callable[[bytes], object]


def _demo_seed(mode: str) -> bytes:
    g = torch.Generator().manual_seed(0)
    items = []
    for s in DEMO_SPECS:
        idx = torch.stack([torch.randperm(s.chunk_numel, generator=g)[: s.k] for _ in range(s.n_chunks)])
        items.append((idx, torch.randn(s.n_chunks, s.k, generator=g)))
    return encode_payload(items, DEMO_SPECS, mode)


def _manifest_seed(run_key: RunKey) -> bytes:
    settings = {"strategy": {"name": "diloco", "inner_steps": 5}, "peers": {"run_id": RUN, "reducer": "mean"}}
    m = RunManifest(RUN, run_key.public_hex, "token", "1.2.3", settings, initial_state_hash="ab" * 32)
    return sign_manifest(run_key, m)


def _table() -> AccusationTable:
    t = AccusationTable()
    t.add_owner_failure(3, "QmPrimary", "QmVerifier")
    t.observe("QmOther", True)
    t.observe("QmOther", False)
    return t


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Decoder, list[bytes]]]:
    """Decoder name -> (decode one input, valid inputs to mutate)."""
    from peers.keys.identity import ensure_identity

    folder = tmp_path_factory.mktemp("fuzz-id")
    path: Path = folder / "id.key"
    ensure_identity(path)
    signer = Signer(path)
    run_key = RunKey.generate(folder / "run.key")
    pub = bytes.fromhex(run_key.public_hex)
    token = run_key.issue(RUN, signer.peer_id, time.time() + 3600)
    records = SignedRecords(signer, Admission("token", RUN, run_public=pub), token)
    rec = DHTRecord(b"k" * 20, msgpack.packb(signer.peer_id), msgpack.packb(b"join"), 1.0e9)
    table = _table()
    envelopes = [
        Envelope("part", RUN, "reduce", 4, b"d" * 16, index=1, weight=2.0, frames=3, nbytes=99, numel=7),
        Envelope("state_hdr", RUN, "state", -1, b"h" * 32, note='{"round": 3}'),
    ]
    return {
        "envelope": (decode_envelope, [encode_envelope(e) for e in envelopes]),
        "ack": (decode_ack, [encode_ack(True), encode_ack(False, "refused")]),
        "packet": (
            decode_packet_bytes,
            [encode_packet_bytes(Packet("none", (3,), "float32", (b"\x00" * 12,), (("k", 1),)))],
        ),
        "record": (
            decode_record,
            [encode_record(PeerRecord("Qm1", RUN, step=5, maddrs=("/ip4/1.2.3.4/tcp/1",), extra={"t": 1}))],
        ),
        "suspicion record": (
            lambda b: decode_signed(RUN, signer.peer_id, b),
            [encode_signed(RUN, table, signer)],
        ),
        "suspicion body": (decode_table, [msgpack.packb(table.to_obj(), use_bin_type=True)]),
        "state announcement": (
            decode_announcement,
            [msgpack.packb({"hash": b"\x01" * 32, "nbytes": 1000, "round": 7}, use_bin_type=True)],
        ),
        "demo payload": (
            lambda b: decode_payload(b, DEMO_SPECS, "fp32"),
            [_demo_seed("fp32")],
        ),
        "demo payload (sign)": (
            lambda b: decode_payload(b, DEMO_SPECS, "sign"),
            [_demo_seed("sign")],
        ),
        "join token": (lambda b: decode_token(b, pub), [token]),
        "state": (
            parse_state,
            [serialize_state({"model.w": torch.arange(6.0).reshape(2, 3)}, {"round": 3, "step": 9})],
        ),
        "DHT record": (
            lambda b: records.check(dataclasses.replace(rec, value=b)),
            [records.sign_value(rec)],
        ),
        "manifest": (parse_manifest, [_manifest_seed(run_key)]),
        "collusion rows": (
            lambda b: decode_rows(b, ROWS),
            [
                encode_rows(
                    {n: torch.randn(m, generator=torch.Generator().manual_seed(1)) for n, m in ROWS.items()}
                )
            ],
        ),
    }


NAMES = [
    "envelope",
    "ack",
    "packet",
    "record",
    "suspicion record",
    "suspicion body",
    "state announcement",
    "demo payload",
    "demo payload (sign)",
    "collusion rows",
    "join token",
    "DHT record",
    "state",
    "manifest",
]

NOT_MSGPACK = {"state", "manifest"}  # safetensors bytes: no msgpack fields to replace


def _only_protocol_errors(decode: Decoder, data: bytes) -> None:
    try:
        decode(data)
    except ProtocolError:
        pass


def test_every_decoder_is_listed_and_accepts_its_seeds(
    decoders: dict[str, tuple[Decoder, list[bytes]]],
) -> None:
    """The seeds are valid, so the mutated runs start from messages each decoder accepts."""
    assert sorted(decoders) == sorted(NAMES)
    for decode, seeds in decoders.values():
        for seed in seeds:
            decode(seed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
@settings(FUZZ, max_examples=40)
@given(batch=st.lists(st.binary(max_size=600), min_size=BATCH, max_size=BATCH))
def test_random_bytes(
    decoders: dict[str, tuple[Decoder, list[bytes]]], name: str, batch: list[bytes]
) -> None:
    decode, _ = decoders[name]
    for data in batch:
        _only_protocol_errors(decode, data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
@settings(FUZZ, max_examples=40)
@given(
    batch=st.lists(
        st.tuples(st.integers(0, 7), st.lists(EDIT, min_size=1, max_size=4)),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_mutated_valid_bytes(
    decoders: dict[str, tuple[Decoder, list[bytes]]], name: str, batch: list[tuple[int, list[Edit]]]
) -> None:
    decode, seeds = decoders[name]
    for pick, edits in batch:
        _only_protocol_errors(decode, mutate(seeds[pick % len(seeds)], edits))


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=40),
    st.binary(max_size=80),
)
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _replace_field(obj: Any, key: str, value: Any, path: int) -> Any:
    """``obj`` with one map entry set to ``value``, or one list item replaced by it (index ``path``)."""
    if isinstance(obj, dict):
        keys = sorted(obj)
        target = keys[path % len(keys)] if keys and path % 3 else key  # sometimes a new key
        return {**obj, target: value}
    if isinstance(obj, list) and obj:
        out = list(obj)
        out[path % len(out)] = value
        return out
    return value


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", [n for n in NAMES if n not in NOT_MSGPACK])
@settings(FUZZ, max_examples=25)
@given(
    batch=st.lists(
        st.tuples(st.integers(0, 7), st.text(max_size=8), _value, st.integers(0, 63)),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_valid_messages_with_one_field_replaced(
    decoders: dict[str, tuple[Decoder, list[bytes]]],
    name: str,
    batch: list[tuple[int, str, Any, int]],
) -> None:
    decode, seeds = decoders[name]
    for pick, key, value, path in batch:
        obj = msgpack.unpackb(seeds[pick % len(seeds)], raw=False, strict_map_key=False)
        _only_protocol_errors(decode, msgpack.packb(_replace_field(obj, key, value, path), use_bin_type=True))


N_LONG = 100_000  # inputs per decoder in the long run (issue 13: >= 100,000, nothing but ProtocolError)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", NAMES)
def test_a_hundred_thousand_inputs_raise_nothing_but_protocol_errors(
    decoders: dict[str, tuple[Decoder, list[bytes]]], name: str
) -> None:
    """A seeded plain loop (hypothesis would spend most of the time on its own bookkeeping): a tenth
    random bytes, the rest valid messages with one to four byte edits (``fuzz_helpers.mutate``)."""
    import random

    decode, seeds = decoders[name]
    rng = random.Random(f"fuzz-{name}")
    ops = ["flip", "set", "insert", "delete", "cut"]
    others: list[str] = []
    for i in range(N_LONG):
        if i % 10 == 0:
            data = rng.randbytes(rng.randrange(0, 600))
        else:
            edits = [
                (rng.choice(ops), rng.randrange(1 << 16), rng.randrange(256))
                for _ in range(rng.randint(1, 4))
            ]
            data = mutate(seeds[i % len(seeds)], edits)
        try:
            decode(data)
        except ProtocolError:
            pass
        except Exception as e:  # collected, so one run reports every kind at once
            others.append(f"{type(e).__name__}: {e}"[:200])
    assert others == [], f"{len(others)} of {N_LONG} inputs raised something else, e.g. {others[:3]}"
