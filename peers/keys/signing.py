"""Signatures with a peer's libp2p identity key: the RSA key behind its peer ID.

A libp2p peer ID of an RSA key is the sha2-256 multihash of the key's protobuf, so a signed message
carries the public key (DER) and a reader checks both that it hashes to the claimed peer ID and that
the signature holds: nobody can sign in another peer's name. Used by the DHT records
(``peers.dht.dht_records``) and the suspicion records (``peers.trust.suspicion``).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from swarmtrain.core.errors import ConfigError, ProtocolError

__all__ = ["Signer", "peer_id_from_public_der", "verify_signed_by", "MAX_PUBLIC_DER"]

#: the DER of an RSA public key up to 4096 bits is ~550 bytes; anything longer is refused unread
MAX_PUBLIC_DER = 1024


def peer_id_from_public_der(der: bytes) -> str:
    """The base58 libp2p peer ID of an RSA public key (DER SubjectPublicKeyInfo), as libp2p derives it."""
    import base58
    from hivemind.proto import crypto_pb2

    pub = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    mh = bytes([0x12, 0x20]) + hashlib.sha256(pub).digest()  # multihash sha2-256 (keys > 42 bytes)
    return str(base58.b58encode(mh).decode())


@functools.lru_cache(maxsize=4096)
def _public_key(der: bytes) -> tuple[str, Any]:
    """(peer ID, loaded RSA key) of a DER public key; parsing and hashing once per key, not per record.

    Raises:
        ProtocolError: not an RSA public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        pub = serialization.load_der_public_key(der)
    except Exception as e:
        raise ProtocolError(f"public key does not parse: {type(e).__name__}") from None
    if not isinstance(pub, rsa.RSAPublicKey) or not 2048 <= pub.key_size <= 4096:
        raise ProtocolError("public key is not an RSA key of 2048 to 4096 bits")
    return peer_id_from_public_der(der), pub


def verify_signed_by(peer_id: str, der: bytes, data: bytes, sig: bytes) -> None:
    """Check that ``sig`` is ``peer_id``'s signature of ``data``, with ``der`` its public key.

    Raises:
        ProtocolError: the key is malformed or not ``peer_id``'s, or the signature does not hold.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    if not isinstance(der, bytes) or not 0 < len(der) <= MAX_PUBLIC_DER or len(sig) > MAX_PUBLIC_DER:
        raise ProtocolError("public key or signature of the wrong size")
    owner, pub = _public_key(der)
    if owner != peer_id:
        raise ProtocolError("the signing key is not the key of the claimed peer ID")
    try:
        pub.verify(sig, data, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise ProtocolError("invalid signature") from None


class Signer:
    """Signs with a peer's libp2p identity key (the RSA key in its identity file).

    Picklable (it keeps the file path and loads the key again), so a DHT record validator holding one
    can travel to hivemind's DHT process.

    Raises:
        ConfigError: the file does not hold an RSA libp2p private key.
    """

    def __init__(self, identity_path: str | Path) -> None:
        self.identity_path = str(identity_path)
        self._load()

    def _load(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from hivemind.proto import crypto_pb2

        path = self.identity_path
        try:
            data = Path(path).expanduser().read_bytes()
            key = serialization.load_der_private_key(
                crypto_pb2.PrivateKey.FromString(data).data, password=None
            )
        except Exception as e:
            raise ConfigError(f"identity file {path} is not a libp2p RSA key: {type(e).__name__}") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ConfigError(f"identity file {path}: only RSA identities can sign")
        self._key = key
        self.public_der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.peer_id = peer_id_from_public_der(self.public_der)

    def __getstate__(self) -> dict[str, str]:
        return {"identity_path": self.identity_path}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.identity_path = state["identity_path"]
        self._load()

    def sign(self, data: bytes) -> bytes:
        """PKCS#1 v1.5 / SHA-256 signature of ``data``."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        return bytes(self._key.sign(data, padding.PKCS1v15(), hashes.SHA256()))
