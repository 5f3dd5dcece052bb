"""Error types shared by every swarmtrain package.

Input checks raise one of these (never ``assert``) so that callers, the CLI and the network code can
tell a bad config from a misbehaving peer and keep running.
"""

from __future__ import annotations

__all__ = [
    "SwarmError",
    "ConfigError",
    "PeerTimeoutError",
    "ProtocolError",
    "UpdateRejected",
]


class SwarmError(Exception):
    """Base class of every error swarmtrain raises on purpose."""


class ConfigError(SwarmError, ValueError):
    """A configuration value, CLI flag or registry name is invalid. The message names the problem."""


class PeerTimeoutError(SwarmError, TimeoutError):
    """A peer (or a whole round) did not answer before its deadline."""


class ProtocolError(SwarmError):
    """Bytes that arrived from a peer are malformed, oversized or inconsistent. Never trusted."""


class UpdateRejected(SwarmError):
    """A peer's contribution or an aggregate failed validation (robust checks, owner checks, bans)."""
