"""A volunteer's own last committed state on disk, so that a restart resumes without a download.

After each committed round the peer loop writes the same snapshot a donor serves
(``swarmtrain.app.peer.state.state_snapshot``: parameters, strategy and inner-optimizer state, step,
round) as safetensors with JSON metadata, plus the run ID and the digest of the parameters every peer
must agree on. One file per identity, next to the identity key (``<identity>.state.safetensors``),
replaced atomically (written to a temporary name, then renamed), so a crash mid-write leaves the
previous state or none, never half of one.

On restart the peer reads the donors' announcements: each vouches for the ``(round, digest)`` of the
states its donor committed (``peers.state.state_transfer``). When the saved ``(round, digest)`` is the
freshest state the donors vouch for, the peer loads it from disk (the digest of what it loaded is
checked against the vouched one) instead of downloading it. The file is read like peer bytes:
bounded, parsed by ``safetensors`` (never ``torch.load``), its metadata validated; a file that is
corrupt or belongs to another run is ignored with one warning, and the peer downloads as usual.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmtrain.core.errors import ProtocolError

__all__ = ["SavedState", "saved_state_path", "save_state", "read_saved_state", "FORMAT"]

logger = logging.getLogger(__name__)

#: the ``saved`` field of a saved state's metadata (a file without it is not one of ours)
FORMAT = "swarmtrain-own-state/1"
#: a saved state larger than this is not read (the same cap as a download's default)
MAX_BYTES = 8 << 30
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class SavedState:
    """A state read back from disk: the snapshot's tensors and meta, its round and shared digest."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    round: int
    digest: str  # hex SHA-256 of the shared parameters (``peer_state.shared_digest``)


def saved_state_path(identity_path: str | os.PathLike[str] | None) -> Path | None:
    """Where a peer with this identity file keeps its last committed state (``None``: no identity
    file, so a restart is a new peer and nothing is kept)."""
    if not identity_path:
        return None
    p = Path(identity_path).expanduser()
    return p.with_name(p.name + ".state.safetensors")


def save_state(
    path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any], *, run_id: str, digest: str
) -> bool:
    """Write the snapshot ``(tensors, meta)`` of a committed round to ``path`` atomically.

    Returns False (one warning) when it could not be written: the run goes on, the next restart
    downloads instead.
    """
    from peers.state.state_transfer import serialize_state

    full = {**meta, "saved": FORMAT, "run_id": run_id, "digest": digest}
    tmp = path.with_name(path.name + ".tmp")
    try:
        data = serialize_state(tensors, full)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)  # no fsync: a crash of the process keeps the page cache; after a power
        os.replace(tmp, path)  # loss a torn file fails to parse and is ignored
    except OSError as e:
        logger.warning("could not save this peer's state to %s: %s", path, e.strerror or e)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # its folder is what failed
        return False
    return True


def read_saved_state(path: Path | None, run_id: str) -> SavedState | None:
    """The state saved at ``path`` for run ``run_id``, or ``None``: no file (silently), or a file that
    is unreadable, too large, corrupt, of another format or of another run (one warning each)."""
    from peers.state.state_transfer import parse_state

    if path is None or not path.exists():
        return None
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ProtocolError(f"{size} bytes, over the {MAX_BYTES} cap")
        tensors, meta = parse_state(path.read_bytes())
        if meta.get("saved") != FORMAT:
            raise ProtocolError("not a saved peer state")
        if meta.get("run_id") != run_id:
            raise ProtocolError(f"of run {str(meta.get('run_id'))[:64]!r}, not {run_id!r}")
        rnd, digest = meta.get("round"), meta.get("digest")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
            raise ProtocolError("no valid round")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise ProtocolError("no valid digest")
    except OSError as e:
        logger.warning("ignoring the saved state %s: %s", path, e.strerror or e)
        return None
    except ProtocolError as e:
        logger.warning("ignoring the saved state %s: %s", path, e)
        return None
    return SavedState(tensors, meta, rnd, digest)
