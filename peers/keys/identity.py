"""Peer identity: a libp2p private key kept in a file, so a peer keeps its peer ID across restarts.

The file holds a serialised libp2p ``PrivateKey`` protobuf (hivemind's format, RSA), readable only by
its owner. :func:`ensure_identity` creates it when missing; :func:`peer_id_of` tells the ID it gives.

Both are written here with ``cryptography`` and a few bytes of protobuf rather than through
``hivemind.p2p``: importing hivemind imports torch (seconds), and ``swarmtrain identity`` must answer
at once. The bytes and IDs equal hivemind's (``tests/unit/test_identity_fast.py``).
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
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"identity path {p} is a directory; give a file path")
    if not p.exists():
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the directory of identity file {p}: {e}") from None
        logger.info("generating a new peer identity in %s", p)
        _generate(p)
    return peer_id_of(p)


def throwaway_identity() -> str:
    """A fresh key file in a private temporary folder removed at exit; returns its path.

    For a peer started without ``identity_path``: its DHT records are signed with its key, which it
    can only read from a file (p2pd reads the same file).
    """
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="swarmtrain-id-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / "identity.key"
    _generate(path)
    return str(path)


def peer_id_of(path: str | os.PathLike[str]) -> str:
    """The base58 peer ID of the key in ``path``.

    Raises:
        ConfigError: missing, oversized or malformed key file.
    """
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read identity file {p}: {e}") from None
    if not data or len(data) > _MAX_KEY_BYTES:
        raise ConfigError(f"identity file {p} is empty or too large to be a key")
    try:
        return _peer_id(data)
    except Exception as e:  # protobuf / crypto errors of a corrupt file
        raise ConfigError(
            f"identity file {p} does not hold a libp2p private key: {type(e).__name__}"
        ) from None


_RSA = 0  # libp2p crypto.proto KeyType.RSA
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key_message(key_type: int, data: bytes) -> bytes:
    """libp2p's ``PrivateKey``/``PublicKey`` protobuf (proto2, both fields required)."""
    return b"\x08" + _varint(key_type) + b"\x12" + _varint(len(data)) + data


def _key_data(message: bytes) -> bytes:
    """The ``data`` field of an RSA ``PrivateKey`` message.

    Raises:
        ValueError: not such a message.
    """
    i, key_type, data = 0, None, None
    while i < len(message):
        tag, i = _read_varint(message, i)
        if tag == 0x08:
            key_type, i = _read_varint(message, i)
        elif tag == 0x12:
            n, i = _read_varint(message, i)
            if i + n > len(message):
                raise ValueError("truncated key")
            data, i = message[i : i + n], i + n
        else:
            raise ValueError(f"unexpected field tag {tag}")
    if key_type != _RSA or data is None:
        raise ValueError("not an RSA private key message")
    return data


def _read_varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while i < len(b) and shift < 64:
        n |= (b[i] & 0x7F) << shift
        i += 1
        if not b[i - 1] & 0x80:
            return n, i
        shift += 7
    raise ValueError("bad varint")


def _base58(raw: bytes) -> str:
    n = int.from_bytes(raw, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _BASE58[r] + out
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + out


def _peer_id(message: bytes) -> str:
    """The base58 peer ID of a serialised RSA private key (libp2p's peer-ID spec: the sha2-256
    multihash of the public key's protobuf, as hivemind's ``PeerID.from_identity``)."""
    import hashlib

    from cryptography.hazmat.primitives import serialization

    key = serialization.load_der_private_key(_key_data(message), password=None)
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashlib.sha256(_key_message(_RSA, public)).digest()
    return _base58(b"\x12\x20" + digest)


def _generate(path: Path) -> None:
    """Write a new 2048-bit RSA identity to ``path`` (mode 0400), as ``P2P.generate_identity``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    path.write_bytes(_key_message(_RSA, der))
    os.chmod(path, 0o400)
