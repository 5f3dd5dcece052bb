"""Admission: who may take part in a run, and the run key that vouches for its members.

Policies (``[peers] admission``):

* ``open``: anyone with a libp2p identity. Records must still be signed by their writer (nobody
  writes in another peer's name), but anyone may write; only a robust reducer and bounded weights
  limit what a stranger does to the model.
* ``allowlist``: the peer IDs in ``[peers] allowlist``.
* ``token``: the run's creator holds the *run key* (Ed25519, :class:`RunKey`) and signs a *join token*
  per volunteer: run ID, peer ID and expiry (``swarmtrain token issue``). Members know the run's public
  key (``[peers] run_public_key``); a peer shows its token with every record it writes.

:meth:`Admission.check` is the one decision; it raises :class:`NotAdmitted` (a ``ProtocolError``).
"""

from __future__ import annotations

import base64
import functools
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from swarmtrain.core.config import PeersConfig
from swarmtrain.core.errors import ConfigError, ProtocolError, SwarmError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "POLICIES",
    "Admission",
    "NotAdmitted",
    "RunKey",
    "Token",
    "decode_token",
    "encode_token_text",
    "parse_token_text",
    "MAX_TOKEN_BYTES",
    "admission_from",
    "AdmissionEnded",
    "OwnAdmission",
    "own_token",
    "check_own_admission",
]

logger = logging.getLogger(__name__)
POLICIES = ("open", "allowlist", "token")
MAX_TOKEN_BYTES = 512
_TOKEN_DOMAIN = b"swarmtrain-join-token-v1\0"


class NotAdmitted(ProtocolError):
    """A peer that the run's admission policy does not let in."""


@dataclass(frozen=True)
class Token:
    """A join token's content (after its signature was checked).

    Attributes:
        run_id: the run it admits to.
        peer_id: the peer it admits.
        expires: Unix time after which it admits nobody.
    """

    run_id: str
    peer_id: str
    expires: float


def _public_key(raw: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if len(raw) != 32:
        raise ConfigError("a run public key is 32 bytes (64 hex digits)")
    return Ed25519PublicKey.from_public_bytes(raw)


class RunKey:
    """The run's Ed25519 signing key (the creator's secret), kept in a PEM file readable by its owner."""

    def __init__(self, key: Any) -> None:
        self._key = key

    @classmethod
    def generate(cls, path: str | os.PathLike[str]) -> RunKey:
        """Make a new key and write it to ``path`` (mode 0600); an existing file is never overwritten.

        Raises:
            ConfigError: the file exists or cannot be written.
        """
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        p = Path(path).expanduser()
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise ConfigError(f"{p} exists; a run key is never overwritten") from None
        except OSError as e:
            raise ConfigError(f"cannot write the run key {p}: {e.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return cls(key)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunKey:
        """Read a key written by :meth:`generate`.

        Raises:
            ConfigError: missing, unreadable or not an Ed25519 private key.
        """
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        p = Path(path).expanduser()
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read the run key {p}: {e.strerror}") from None
        try:
            key = serialization.load_pem_private_key(data[:4096], password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{p} is not a run key (an Ed25519 private key in PEM)")
        return cls(key)

    @property
    def public_hex(self) -> str:
        """The public key as 64 hex digits (``[peers] run_public_key``)."""
        from cryptography.hazmat.primitives import serialization

        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return bytes(raw).hex()

    def sign(self, data: bytes) -> bytes:
        """The key's Ed25519 signature of ``data`` (callers prefix a domain tag of their own)."""
        return bytes(self._key.sign(data))

    def issue(self, run_id: str, peer_id: str, expires: float) -> bytes:
        """A join token admitting ``peer_id`` to ``run_id`` until ``expires`` (Unix time)."""
        if not peer_id or len(peer_id) > 128 or not run_id:
            raise ConfigError("a token needs a run ID and a peer ID (at most 128 characters)")
        body = bytes(msgpack.packb([run_id, peer_id, float(expires)], use_bin_type=True))
        sig = bytes(self._key.sign(_TOKEN_DOMAIN + body))
        return bytes(msgpack.packb([body, sig], use_bin_type=True))


@functools.lru_cache(maxsize=4096)
def decode_token(token: bytes, run_public: bytes) -> Token:
    """Check a token's signature against the run's public key and return its content.

    Raises:
        NotAdmitted: malformed, oversized, or not signed by the run key.
    """
    from cryptography.exceptions import InvalidSignature

    if len(token) > MAX_TOKEN_BYTES:
        raise NotAdmitted("join token too large")
    try:
        outer = unpack(
            token,
            what="join token",
            max_bytes=MAX_TOKEN_BYTES,
            max_bin=MAX_TOKEN_BYTES,
            max_array=2,
            max_map=0,
        )
        if not (isinstance(outer, list) and len(outer) == 2 and all(isinstance(x, bytes) for x in outer)):
            raise ProtocolError("join token is not [body, signature]")
        body, sig = outer
        inner = unpack(body, what="join token body", max_bytes=MAX_TOKEN_BYTES, max_array=3, max_map=0)
    except ProtocolError as e:
        raise NotAdmitted(str(e)) from None
    if not (
        isinstance(inner, list)
        and len(inner) == 3
        and isinstance(inner[0], str)
        and isinstance(inner[1], str)
        and isinstance(inner[2], float)
    ):
        raise NotAdmitted("join token body is not [run, peer, expiry]")
    try:
        _public_key(run_public).verify(sig, _TOKEN_DOMAIN + body)
    except InvalidSignature:
        raise NotAdmitted("join token not signed by this run's key") from None
    return Token(run_id=inner[0], peer_id=inner[1], expires=inner[2])


def encode_token_text(token: bytes) -> str:
    """A token as one line of URL-safe base64 (what ``swarmtrain token issue`` prints)."""
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def parse_token_text(text: str) -> bytes:
    """Inverse of :func:`encode_token_text`.

    Raises:
        ConfigError: not a token's text.
    """
    s = text.strip()
    if not s or len(s) > 2 * MAX_TOKEN_BYTES:
        raise ConfigError("the join token is empty or too long")
    try:
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    except ValueError:
        raise ConfigError("the join token is not URL-safe base64 text") from None


@dataclass(frozen=True)
class Admission:
    """A run's admission policy (see the module docstring).

    Attributes:
        policy: ``open``, ``allowlist`` or ``token``.
        run_id: the run (a token for another run admits nobody).
        allowlist: the admitted peer IDs (policy ``allowlist``).
        run_public: the run key's 32 public bytes (policy ``token``).
    """

    policy: str = "open"
    run_id: str = ""
    allowlist: frozenset[str] = frozenset()
    run_public: bytes | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"admission must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        if self.policy == "allowlist" and not self.allowlist:
            raise ConfigError("admission 'allowlist' needs at least one peer ID in allowlist")
        if self.policy == "token":
            if self.run_public is None:
                raise ConfigError("admission 'token' needs run_public_key (swarmtrain run init prints it)")
            _public_key(self.run_public)

    def check(self, peer_id: str, token: bytes | None, now: float | None = None) -> None:
        """Raise :class:`NotAdmitted` unless ``peer_id`` (showing ``token``) may take part.

        Args:
            now: Unix time for the token's expiry (default: now).
        """
        if self.policy == "open":
            return
        if self.policy == "allowlist":
            if peer_id not in self.allowlist:
                raise NotAdmitted(f"peer {peer_id[:16]} is not on the run's allowlist")
            return
        if not token or self.run_public is None:  # (__post_init__ made sure of a run key)
            raise NotAdmitted(f"peer {peer_id[:16]} shows no join token")
        tok = decode_token(token, self.run_public)
        if tok.run_id != self.run_id or tok.peer_id != peer_id:
            raise NotAdmitted(f"the join token of {peer_id[:16]} is for another run or peer")
        if tok.expires < (time.time() if now is None else now):
            raise NotAdmitted(f"the join token of {peer_id[:16]} has expired")

    def token_expiry(self, token: bytes) -> float:
        """The Unix time a token (already checked by :meth:`check`) stops admitting its peer."""
        assert self.run_public is not None
        return decode_token(token, self.run_public).expires


def admission_from(cfg: PeersConfig) -> Admission:
    """The policy of ``[peers]`` (``admission``, ``allowlist``, ``run_public_key``).

    Raises:
        ConfigError: an incomplete policy (no allowlist, no run public key) or a malformed key.
    """
    raw = None
    if cfg.run_public_key:
        try:
            raw = bytes.fromhex(cfg.run_public_key)
        except ValueError:
            raise ConfigError("run_public_key must be 64 hex digits") from None
    return Admission(cfg.admission, cfg.run_id, frozenset(cfg.allowlist), raw)


def own_token(cfg: PeersConfig, admission: Admission, peer_id: str, *, check: bool = True) -> bytes | None:
    """This peer's join token (``[peers] token``), checked against the policy up front (``check``).

    Raises:
        ConfigError: the policy keeps this peer out (no token, another peer's or run's, expired, not on
            the allowlist): one line saying why, before anything starts.
    """
    token = parse_token_text(cfg.token) if cfg.token else None
    if not check:
        return token
    try:
        admission.check(peer_id, token)
    except NotAdmitted as e:
        hint = {
            "token": f"; ask the run's creator for a token for peer ID {peer_id} (swarmtrain token issue)",
            "allowlist": f"; ask the run's creator to add peer ID {peer_id} to the allowlist",
        }.get(admission.policy, "")
        raise ConfigError(f"this peer is not admitted to run {cfg.run_id!r}: {e}{hint}") from None
    return token


class AdmissionEnded(SwarmError):
    """This peer's own admission ended while it ran (its join token expired): others now refuse it."""


#: seconds between a running peer's checks of its own admission (:class:`OwnAdmission`)
OWN_CHECK_S = 5.0


class OwnAdmission:
    """A running peer's check that the policy still admits it (a token expires mid-run): once the
    token has expired every other peer refuses its records and streams, so it stops with one line
    instead of failing rounds with warnings.

    Args:
        admission: the run's policy; token: this peer's token; peer_id: this peer.
    """

    def __init__(self, admission: Admission, token: bytes | None, peer_id: str) -> None:
        self.admission, self.token, self.peer_id = admission, token, peer_id
        self._next = time.monotonic() + OWN_CHECK_S
        #: ``time.monotonic()`` at which the token expires (inf: no token, or one that did not decode,
        #: which :meth:`check` reports)
        self.ends_at = math.inf
        if admission.policy == "token" and token:
            try:
                self.ends_at = time.monotonic() + admission.token_expiry(token) - time.time()
            except Exception:
                pass

    def rounds_end_by(self) -> float | None:
        """``time.monotonic()`` past which no round of this peer should wait (``Deadlines.end_by``):
        a second after the token expires, so the next step's :meth:`check` ends the peer instead of
        a round's own timeout; ``None`` without an expiry."""
        return self.ends_at + 1.0 if math.isfinite(self.ends_at) else None

    def check(self, now: float | None = None) -> None:
        """Raise :class:`AdmissionEnded` (at most every :data:`OWN_CHECK_S` s, and at once past the
        token's expiry) once the policy refuses this peer; ``now``: the wall-clock time to judge the
        token by (default: now)."""
        if self.admission.policy == "open":
            return
        if now is None and time.monotonic() < min(self._next, self.ends_at):
            return
        self._next = time.monotonic() + OWN_CHECK_S
        try:
            self.admission.check(self.peer_id, self.token, now)
        except NotAdmitted as e:
            hint = " (ask the run's creator for a new one: swarmtrain token issue)" if self.token else ""
            raise AdmissionEnded(
                f"this peer is no longer admitted to run {self.admission.run_id!r}: {e}{hint}"
            ) from None


def check_own_admission(cfg: PeersConfig) -> None:
    """Fail at once, before any work, when the policy keeps this peer out (``swarmtrain join``).

    Raises:
        ConfigError: one line: no identity file where a token or the allowlist names a peer ID, or
            what :func:`own_token` says.
    """
    admission = admission_from(cfg)
    if admission.policy == "open":
        return
    if not cfg.identity_path:
        raise ConfigError(
            f"run {cfg.run_id!r} admits by {admission.policy}, which names peer IDs: pass --identity FILE "
            "(keep the file; `swarmtrain identity FILE` prints its peer ID)"
        )
    from peers.keys.identity import ensure_identity

    own_token(cfg, admission, ensure_identity(cfg.identity_path))
