"""Peer identity: a libp2p private key kept in a file, so a peer keeps its peer ID across restarts.

The file holds a serialised libp2p ``PrivateKey`` protobuf (hivemind's format, RSA), readable only by
its owner. :func:`ensure_identity` creates it when missing; :func:`peer_id_of` tells the ID it gives.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from swarmtrain.core.errors import ConfigError

__all__ = ["ensure_identity", "peer_id_of", "throwaway_identity", "default_identity_path"]

logger = logging.getLogger(__name__)
_MAX_KEY_BYTES = 16 * 1024


def default_identity_path() -> Path:
    """This machine's volunteer identity when none is given: ``$XDG_DATA_HOME/swarmtrain/identity.key``
    (``~/.local/share/swarmtrain/identity.key``); ``swarmtrain identity`` prints its peer ID, the one
    a join token is issued for."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "swarmtrain" / "identity.key"


def ensure_identity(path: str | os.PathLike[str]) -> str:
    """Create the key file at ``path`` if it does not exist; return the peer ID it defines.

    Raises:
        ConfigError: the path is a directory, unreadable, or does not hold a valid key.
    """
    from hivemind.p2p import P2P

    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"identity path {p} is a directory; give a file path")
    if not p.exists():
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the directory of identity file {p}: {e}") from None
        logger.info("generating a new peer identity in %s", p)
        P2P.generate_identity(str(p))
    return peer_id_of(p)


def throwaway_identity() -> str:
    """A fresh key file in a private temporary folder removed at exit; returns its path.

    For a peer started without ``identity_path``: its DHT records are signed with its key, which it
    can only read from a file (p2pd reads the same file).
    """
    import atexit
    import shutil
    import tempfile

    from hivemind.p2p import P2P

    folder = tempfile.mkdtemp(prefix="swarmtrain-id-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = str(Path(folder) / "identity.key")
    P2P.generate_identity(path)
    return path


def peer_id_of(path: str | os.PathLike[str]) -> str:
    """The base58 peer ID of the key in ``path``.

    Raises:
        ConfigError: missing, oversized or malformed key file.
    """
    from hivemind.p2p import PeerID

    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read identity file {p}: {e}") from None
    if not data or len(data) > _MAX_KEY_BYTES:
        raise ConfigError(f"identity file {p} is empty or too large to be a key")
    try:
        return str(PeerID.from_identity(data).to_base58())
    except Exception as e:  # protobuf / crypto errors of a corrupt file
        raise ConfigError(
            f"identity file {p} does not hold a libp2p private key: {type(e).__name__}"
        ) from None
