"""The round engine's pure parts: ``RoundIO``'s one wait loop (aborts, own failed sends, disconnected
members, timeouts, digests), the butterfly of a one-member round, and the malicious-owner reducer
wrapper that the owner check's verifier unwraps."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
import torch

from peers.reducers import build_reducer
from peers.rounds.butterfly import ButterflyRound, NoCheck, _mean_into
from peers.rounds.group import Group, group_digest
from peers.rounds.owner_check import fit_reducer, honest_reducer, reduce_as_owner
from peers.rounds.round_errors import QUIET, MemberAborted, MemberGone, RoundTimeout, SendFailed, WrongGroup
from peers.rounds.round_io import PhaseClock, RoundIO, RoundLink
from peers.rounds.weights import bound_weights
from peers.wire.mailbox import Delivery, Mailbox
from peers.wire.messages import Envelope
from swarmtrain.simulation.attacks import MaliciousOwnerReducer

ME, OTHER, STRANGER = "A", "B", "Z"


def _io(members: tuple[str, ...] = (ME, OTHER), connected: set[str] | None = None) -> tuple[RoundIO, list]:
    sent: list[tuple[str, Envelope]] = []

    def send(peer: str, env: Envelope, frames: list[Any], deadline: float) -> Future[None]:
        sent.append((peer, env))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    link = RoundLink(ME, "run", Mailbox(1 << 20), send, lambda: connected)
    group = Group(
        "reduce", 0, members, members[0], group_digest("run", "reduce", 0, members), members.index(ME)
    )
    return RoundIO(link, group, "reduce", time.monotonic() + 5.0, PhaseClock()), sent


def _put(io: RoundIO, sender: str, typ: str, digest: bytes | None = None, note: str = "") -> None:
    env = io.envelope(typ, note=note) if digest is None else io.envelope(typ, digest=digest, note=note)
    io.link.mailbox.put(Delivery(sender, env, ()))


def _wait_have(io: RoundIO, *, own_failures: bool = True, poll: float = 2.0) -> Any:
    keys = [("have", OTHER, 0)]
    return io.wait(
        lambda s: all(k in s for k in keys),
        lambda s: [k[1] for k in keys if k not in s],
        timeout_text="timed out waiting for have",
        until=time.monotonic() + 0.3,
        poll=poll,
        own_failures=own_failures,
    )


def test_wait_returns_once_ready() -> None:
    io, _ = _io()
    _put(io, OTHER, "have")
    assert ("have", OTHER, 0) in _wait_have(io)


def test_a_member_abort_ends_the_wait_as_member_aborted_which_is_quiet() -> None:
    io, _ = _io()
    _put(io, OTHER, "abort", note="gone")
    with pytest.raises(MemberAborted, match="aborted: gone") as e:
        _wait_have(io)
    assert isinstance(e.value, QUIET)


def test_an_own_failed_send_ends_the_wait_unless_only_members_count() -> None:
    io, _ = _io()
    _put(io, ME, "abort", note="refused")
    with pytest.raises(SendFailed, match="sending failed: refused") as e:
        _wait_have(io)
    assert not isinstance(e.value, QUIET)
    with pytest.raises(RoundTimeout, match=r"timed out waiting for have from \['B'\]"):
        _wait_have(io, own_failures=False)


def test_an_abort_from_a_non_member_or_another_group_is_ignored() -> None:
    io, _ = _io()
    _put(io, STRANGER, "abort")
    _put(io, OTHER, "abort", digest=b"x" * 16)
    with pytest.raises(RoundTimeout):
        _wait_have(io)


def test_a_missing_member_that_disconnected_fails_the_wait_early() -> None:
    io, _ = _io(connected={ME})
    with pytest.raises(MemberGone, match="disconnected"):
        _wait_have(io, poll=0.05)


def test_wait_keys_checks_every_digest() -> None:
    io, _ = _io()
    _put(io, OTHER, "have", digest=b"y" * 16)
    with pytest.raises(WrongGroup, match="another group"):
        io.wait_keys([("have", OTHER, 0)], io.group.digest)


def test_abort_goes_to_every_other_member() -> None:
    io, sent = _io((ME, OTHER, "C"))
    io.abort("why")
    assert [(p, e.type, e.note, e.digest) for p, e in sent] == [
        (OTHER, "abort", "why", io.group.digest),
        ("C", "abort", "why", io.group.digest),
    ]


def test_a_one_member_butterfly_returns_its_own_tensors() -> None:
    from compression import build_compressor
    from swarmtrain.core.config import CompressionConfig

    io, sent = _io((ME,))
    tensors = {"w": torch.randn(3, 5), "h": torch.randn(7).to(torch.bfloat16)}
    comp = build_compressor(CompressionConfig(codec="none"))
    reducer = build_reducer("mean")
    out = ButterflyRound(io, tensors, comp, reducer, 1.0, NoCheck(), chunk_elems=4).run()
    assert sent == []
    assert torch.equal(out["w"], tensors["w"]) and out["h"].dtype == torch.bfloat16
    assert {"encode_parts", "exchange", "wait_sends"} <= set(io.clock.phases)


def test_malicious_owner_reducer_corrupts_and_its_verifier_sees_the_honest_reducer() -> None:
    median = build_reducer("coordinate_median", 1)
    bad = MaliciousOwnerReducer(median, mode="sign_flip", scale=2.0)
    stack, w = torch.randn(4, 9), torch.ones(4)
    honest = median.reduce(stack, w)
    assert torch.equal(bad.reduce(stack, w), -2.0 * honest)
    assert honest_reducer(bad) is median and honest_reducer(median) is median
    assert bad.n_byzantine == 1 and bad.min_peers(1) == median.min_peers(1)
    fitted = fit_reducer(bad, 2)  # too few rows for f=1: a copy with f lowered, inner copied too
    assert isinstance(fitted, MaliciousOwnerReducer) and fitted is not bad
    assert fitted.n_byzantine == 0 and median.n_byzantine == 1
    assert honest_reducer(fitted).n_byzantine == 0  # type: ignore[attr-defined]


def test_the_verifier_caps_claimed_weights_as_the_owner_does() -> None:
    """A member claiming weight 1e30: the owner's mean caps it (``bound_weights``), and so must the
    verifier's replay, or an honest owner's aggregate mismatches and the owner is blamed."""
    rows = [torch.full((5,), float(i)) for i in range(4)]
    claimed = [1.0, 1.0, 1.0, 1e30]
    owner = _mean_into(torch.empty(5), rows, bound_weights(claimed))
    verifier = reduce_as_owner(build_reducer("mean", 0), torch.stack(rows), claimed)
    assert torch.allclose(verifier, owner)  # (0 + 1 + 2 + 3 * 2) / 5 = 1.8
    assert torch.allclose(owner, torch.full((5,), 1.8))
    uncapped = build_reducer("mean", 0).reduce(torch.stack(rows), torch.tensor(claimed))
    assert not torch.allclose(verifier, uncapped)  # the claim as made would be row 3 alone


def test_a_chunk_its_codec_cannot_decode_is_a_protocol_error() -> None:
    """A codec's own ValueError/RuntimeError on a peer's packet must not escape ``all_reduce``."""
    from compression import Int8Compressor
    from peers.rounds.round_io import decode_chunk
    from peers.wire.messages import encode_packet_bytes
    from swarmtrain.core.errors import ProtocolError

    class Broken(Int8Compressor):
        def decompress(self, p: Any) -> torch.Tensor:
            raise ValueError("scales do not match the codes")

    frame = encode_packet_bytes(Int8Compressor().compress(torch.ones(8)))
    assert torch.equal(decode_chunk(Int8Compressor(), [frame], 8), torch.ones(8))
    with pytest.raises(ProtocolError, match="does not decode: ValueError"):
        decode_chunk(Broken(), [frame], 8)
