"""Admission with a lifetime on real peers (issue 30.3): a peer whose join token expires mid-run is
refused within seconds after it, and a peer the run key revokes (``swarmtrain token revoke``, a
separate process storing the revocation in the run's DHT) is refused within the revocation read
interval. Three ``PeerNode`` (each its own DHT process and p2p daemon) on 127.0.0.1 under the
``token`` policy; the refused streams are real probe streams (``peers.dht.probe``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from peer_helpers import loopback_config

from peers.trust.admission import RunKey, encode_token_text

RUN = "t-lifetime"


def _node(key: RunKey, ident: Path, expires: float, initial: list[str]) -> object:
    from peers import PeerNode
    from peers.keys.identity import ensure_identity

    peer_id = ensure_identity(ident)
    cfg = loopback_config(
        RUN,
        initial,
        admission="token",
        run_public_key=key.public_hex,
        identity_path=str(ident),
        token=encode_token_text(key.issue(RUN, peer_id, expires)),
    )
    return PeerNode(cfg, heartbeat_ttl=30.0)


def _refused(node: object, peer_id: str) -> bool:
    from peers.dht.probe import probe_peer
    from swarmtrain.core.errors import SwarmError

    try:
        probe_peer(node, peer_id, pings=1, download_bytes=1024, timeout=15)
    except SwarmError:  # ProtocolError too: the server closed the stream
        return True
    return False


def _revoke_by_cli(tmp_path: Path, key: RunKey, peer_id: str, initial: list[str]) -> None:
    """``swarmtrain token revoke`` with a config holding the creator's own identity and token."""
    import subprocess
    import sys

    from peers.keys.identity import ensure_identity

    creator = tmp_path / "creator.key"
    token = encode_token_text(key.issue(RUN, ensure_identity(creator), time.time() + 3600))
    cfg = tmp_path / "creator.toml"
    cfg.write_text(
        f'[peers]\nrun_id = "{RUN}"\nadmission = "token"\nrun_public_key = "{key.public_hex}"\n'
        f'identity_path = "{creator}"\ntoken = "{token}"\nhost_maddrs = ["/ip4/127.0.0.1/tcp/0"]\n'
    )
    cmd = [sys.executable, "-m", "swarmtrain", "token", "revoke", "--run-key", str(tmp_path / "run.key")]
    cmd += ["--config", str(cfg), "--initial-peers", initial[0], peer_id]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "revoked" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@pytest.mark.slow  # 20-47 s: out of the quick loop
@pytest.mark.timeout(150)
def test_an_expired_or_revoked_token_is_refused_mid_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import peers.trust.admitted as admitted

    monkeypatch.setattr(admitted, "REVOCATION_READ_S", 2.0)  # the node's AdmittedPeers lives here
    key = RunKey.generate(tmp_path / "run.key")
    far = time.time() + 3600
    a = _node(key, tmp_path / "a.key", far, [])
    nodes = [a]
    try:
        initial = list(a.visible_maddrs)  # type: ignore[attr-defined]
        expires = time.time() + 20
        b = _node(key, tmp_path / "b.key", expires, initial)
        nodes.append(b)
        c = _node(key, tmp_path / "c.key", far, initial)
        nodes.append(c)
        a_id = a.peer_id  # type: ignore[attr-defined]
        assert not _refused(b, a_id), "an admitted peer's probe was refused"
        assert not _refused(c, a_id)
        assert time.time() < expires - 1, "the machine was too slow for this test's token lifetime"
        time.sleep(max(expires - time.time(), 0.0))
        t_exp = time.monotonic()
        while not _refused(b, a_id):
            assert time.monotonic() - t_exp < 10, "an expired token still admits its peer"
            time.sleep(0.5)
        t_exp = time.monotonic() - t_exp
        assert not _refused(c, a_id)  # c's token is still good
        _revoke_by_cli(tmp_path, key, c.peer_id, initial)  # type: ignore[attr-defined]
        t0 = time.monotonic()
        while not _refused(c, a_id):  # honoured at the next revocation read (2 s here, 20 s by default)
            assert time.monotonic() - t0 < 20, "a revoked peer is still served"
            time.sleep(0.5)
        print(
            f"expired peer refused {t_exp:.1f} s after its expiry, "
            f"revoked one {time.monotonic() - t0:.1f} s after the revocation was stored"
        )
        assert c.peer_id in a.admitted.refused() and b.peer_id in a.admitted.refused()  # type: ignore[attr-defined]
    finally:
        for n in reversed(nodes):
            n.shutdown()  # type: ignore[attr-defined]
