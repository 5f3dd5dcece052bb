"""Identity files without hivemind (issue 31.6): the bytes and peer IDs equal hivemind's, and
``swarmtrain identity`` answers in under a second because it imports neither hivemind nor torch."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from peers.keys.identity import ensure_identity, peer_id_of
from swarmtrain.core.errors import ConfigError


def test_our_identity_files_and_peer_ids_are_hivemind_s(tmp_path: Path) -> None:
    from hivemind.p2p import P2P, PeerID

    ours = tmp_path / "ours.key"
    theirs = tmp_path / "theirs.key"
    ensure_identity(ours)
    P2P.generate_identity(str(theirs))
    for path in (ours, theirs):
        data = path.read_bytes()
        assert peer_id_of(path) == PeerID.from_identity(data).to_base58()
    assert ours.stat().st_mode & 0o777 == 0o400
    (tmp_path / "bad.key").write_bytes(b"\x08\x01\x12\x03abc")
    with pytest.raises(ConfigError, match="does not hold a libp2p private key"):
        peer_id_of(tmp_path / "bad.key")


def test_swarmtrain_identity_imports_neither_hivemind_nor_torch(tmp_path: Path) -> None:
    key = tmp_path / "vol.key"
    code = (
        "import sys; from swarmtrain.app.cli import main\n"
        "sys.argv = ['swarmtrain', 'identity', sys.argv[1]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('heavy:', sorted(m for m in ('torch', 'hivemind') if m in sys.modules))"
    )
    t0 = time.perf_counter()
    got = subprocess.run([sys.executable, "-c", code, str(key)], capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    assert got.returncode == 0, got.stderr
    peer_id, heavy = got.stdout.strip().splitlines()
    assert peer_id == peer_id_of(key) and heavy == "heavy: []", got.stdout
    assert took < 10  # a hang guard; the figure on an idle machine is under 1 s (the imports above)
