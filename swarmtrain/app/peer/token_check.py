"""A volunteer's ``--token`` against the manifest its initial peer served, before any work.

The manifest is signed by the run key that issues the run's tokens, so a token that does not verify
under the manifest's key means one of three things, each refused with its own line:

* the text is not a join token at all (``garbage123``, half a line): it does not parse;
* the token was altered in copying: one character differs from a token that key signed (found by
  trying every one-character change, a few thousand signature checks, only on this failure path);
* the initial peer is another run's, or an impostor's: its key signed nothing like this token.

The check runs whatever admission policy the manifest states: an impostor's manifest saying
``open`` must not skip it.
"""

from __future__ import annotations

import string

from peers.trust.admission import MAX_TOKEN_BYTES, NotAdmitted, decode_token, parse_token_text
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = ["check_token_signer", "token_run_id"]

_B64 = string.ascii_letters + string.digits + "-_"
#: longer texts are not tried character by character (a real token is about 190 characters)
_MAX_FIX_CHARS = 400


def token_run_id(raw: bytes) -> str | None:
    """The run ID a token's body names, without checking its signature (``None``: not a token)."""
    try:
        outer = unpack(
            raw, what="join token", max_bytes=MAX_TOKEN_BYTES, max_bin=MAX_TOKEN_BYTES, max_array=2, max_map=0
        )
        if not (isinstance(outer, list) and len(outer) == 2 and all(isinstance(x, bytes) for x in outer)):
            return None
        inner = unpack(outer[0], what="join token body", max_bytes=MAX_TOKEN_BYTES, max_array=3, max_map=0)
    except ProtocolError:
        return None
    if (
        isinstance(inner, list)
        and len(inner) == 3
        and isinstance(inner[0], str)
        and isinstance(inner[1], str)
    ):
        return inner[0]
    return None


def _verifies(text: str, key: bytes) -> bool:
    try:
        decode_token(parse_token_text(text), key)
    except (NotAdmitted, ConfigError, ValueError):
        return False
    return True


def _one_char_fix(text: str, key: bytes) -> tuple[int, str] | None:
    """``(position, right character)`` when changing one character of ``text`` gives a token that
    ``key`` signed; ``None`` otherwise."""
    if len(text) > _MAX_FIX_CHARS:
        return None
    for i, old in enumerate(text):
        for c in _B64:
            if c != old and _verifies(text[:i] + c + text[i + 1 :], key):
                return i, c
    return None


def check_token_signer(token_text: str, run_id: str, run_public_hex: str) -> None:
    """Refuse, in one line, a token that the key of run ``run_id``'s manifest did not sign.

    Raises:
        ConfigError: the token does not parse, was altered (one character), or was issued by another
            key than the manifest's (the initial peer is not this run's).
    """
    text = token_text.strip()
    how = "paste the whole line `swarmtrain token issue` printed"
    try:
        raw = parse_token_text(text)
    except ConfigError as e:
        raise ConfigError(f"--token is not a join token ({e}): {how}") from None
    run_of_token = token_run_id(raw)
    if run_of_token is None:
        raise ConfigError(f"--token is not a join token (it does not parse): {how}")
    try:
        key = bytes.fromhex(run_public_hex)
        decode_token(raw, key)
        return
    except (NotAdmitted, ValueError):
        pass
    fix = _one_char_fix(text, key)
    if fix is not None:
        i, c = fix
        raise ConfigError(
            f"--token has a bad signature: its character {i + 1} ({text[i]!r}) differs from a token run "
            f"{run_id!r}'s key signed (there: {c!r}); copy the token again"
        )
    other = f"your token is for run {run_of_token!r}, " if run_of_token != run_id else ""
    raise ConfigError(
        f"the initial peer serves a manifest of run {run_id!r} signed by key {run_public_hex[:12]}..., "
        f"which did not issue your token: {other}the initial peer is not your run's (check the address)"
    )
