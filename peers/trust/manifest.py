"""The run manifest: the run's settings, signed by its run key (the run's root of trust).

``swarmtrain run init`` writes it once; every peer that holds it serves it (``peers.dht.manifest_service``)
and a volunteer that knows only an ``--initial-peers`` address fetches it from that peer, checks it,
and takes the run's settings from it. The document is JSON::

    {"manifest": {...}, "signature": "<128 hex digits>"}

``signature`` is the run key's Ed25519 signature over a domain tag and the canonical JSON of
``manifest`` (sorted keys, no spaces); ``manifest.run_public_key`` names the key. Anything fetched is
untrusted: at most :data:`MAX_MANIFEST_BYTES`, nesting at most :data:`MAX_DEPTH` levels, a fixed
schema, and every failure is a :class:`~swarmtrain.core.errors.ProtocolError`.

Which peer's manifest to believe: the one served by the peer named in the address the volunteer was
given (libp2p authenticates that peer ID), and, when the volunteer holds a join token, only a manifest
whose run key signed that token. An impostor can serve a manifest signed by its own key, but no
token of the real run verifies under it.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmtrain.core.errors import ProtocolError

__all__ = [
    "RunManifest",
    "MAX_MANIFEST_BYTES",
    "MAX_DEPTH",
    "RUN_WIDE",
    "RUN_WIDE_SETTINGS",
    "RunWideSetting",
    "PUBLISHED",
    "ROBUST_REDUCERS",
    "FORMAT",
    "sign_manifest",
    "parse_manifest",
    "open_policy_problem",
    "run_wide_settings",
    "compatible_versions",
    "read_manifest_file",
]

FORMAT = 1
MAX_MANIFEST_BYTES = 64 << 10
MAX_DEPTH = 8  # {"manifest": {"settings": {"strategy": {"options": ...}}}} is 4; leave room
_DOMAIN = b"swarmtrain-run-manifest-v1\0"
_HEX = re.compile(r"^[0-9a-f]*$")
_PEER_ID = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{1,128}$")  # base58


@dataclass(frozen=True)
class RunWideSetting:
    """A setting every peer of a run must share.

    Attributes:
        key: a config section (the whole of it, e.g. ``model``) or one field of it (``train.seed``).
        record: its name in a training peer's signed record (``None``: not published there); a
            volunteer compares its own with the live trainers' before it trains
            (``swarmtrain.app.peer.run_agreement``).
        how: how a volunteer sets it, named when its value differs from the run's.
    """

    key: str
    record: str | None = None
    how: str | None = None


#: the settings every peer of a run must share, the one list: the manifest carries them
#: (:data:`RUN_WIDE`) and the training peers publish those with a ``record`` name
#: (:data:`PUBLISHED`). Everything else (device, threads, batch size, steps, data paths, addresses,
#: timeouts) is the peer's own.
RUN_WIDE_SETTINGS: tuple[RunWideSetting, ...] = (
    RunWideSetting("model"),
    RunWideSetting("strategy"),
    RunWideSetting("strategy.name", "strategy", "--strategy"),
    RunWideSetting("strategy.inner_steps", "inner_steps", "--inner-steps"),
    RunWideSetting("compression"),
    RunWideSetting("compression.codec", "codec", "--compressor"),
    RunWideSetting("swarm"),  # a SWARM run's stages, codecs, trainers, steps and rebalancing rule
    *(
        RunWideSetting(f"train.{name}")
        for name in (
            "seed",
            "optimizer",
            "lr",
            "min_lr",
            "warmup_steps",
            "weight_decay",
            "beta1",
            "beta2",
            "grad_clip",
        )
    ),
    RunWideSetting("peers.run_id"),
    RunWideSetting("peers.admission"),
    RunWideSetting("peers.allowlist"),
    RunWideSetting("peers.run_public_key"),
    RunWideSetting("peers.reducer", "reducer", "[peers] reducer"),
    RunWideSetting("peers.byzantine_f", "byzantine_f", "[peers] byzantine_f"),
    RunWideSetting("peers.reducer_options"),
    RunWideSetting("peers.owner_check"),
    RunWideSetting("peers.ban_strikes"),
)


def _sections(settings: tuple[RunWideSetting, ...]) -> dict[str, tuple[str, ...] | None]:
    out: dict[str, tuple[str, ...] | None] = {}
    for s in settings:
        section, _, name = s.key.partition(".")
        if not name:
            out[section] = None
        elif out.get(section, ()) is not None:
            out[section] = (*(out.get(section) or ()), name)
    return out


#: the run-wide config sections a manifest carries (section -> fields; ``None``: the whole section)
RUN_WIDE: dict[str, tuple[str, ...] | None] = _sections(RUN_WIDE_SETTINGS)

#: the run-wide settings a training peer publishes in its record, by their name there
PUBLISHED: dict[str, RunWideSetting] = {s.record: s for s in RUN_WIDE_SETTINGS if s.record is not None}

#: reducers that bound what f Byzantine members do to a round (``mean`` does not)
ROBUST_REDUCERS = (
    "centered_clip",
    "coordinate_median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "geometric_median",
)


def open_policy_problem(admission: str, reducer: str, byzantine_f: int) -> str | None:
    """Why ``admission = open`` cannot run with this reducer, or ``None`` when it can.

    Under ``open`` anyone reaches the reducer; ``mean`` (bounded weights or not) lets one stranger move
    the average anywhere, so an open run needs a robust reducer tolerating at least one peer.
    """
    if admission != "open":
        return None
    if reducer not in ROBUST_REDUCERS:
        return (
            f"admission 'open' lets anyone into the average, so reducer {reducer!r} is refused: use a "
            f"robust one ({', '.join(ROBUST_REDUCERS[:3])}, ...) with byzantine_f >= 1, or admission token"
        )
    if byzantine_f < 1:
        return f"admission 'open' with reducer {reducer!r} needs byzantine_f >= 1 (it tolerates nobody now)"
    return None


def run_wide_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`RUN_WIDE` part of a whole config (``Config.model_dump(mode="json")``)."""
    out: dict[str, Any] = {}
    for section, fields in RUN_WIDE.items():
        table = config.get(section)
        if not isinstance(table, Mapping):
            continue
        out[section] = dict(table) if fields is None else {k: table[k] for k in fields if k in table}
    return out


def compatible_versions(a: str, b: str) -> bool:
    """Peers of one run need the same major.minor version (patch releases keep the wire format)."""
    return a.split(".")[:2] == b.split(".")[:2]


@dataclass(frozen=True)
class RunManifest:
    """A checked manifest.

    Attributes:
        run_id: the run's ID.
        run_public_key: the run key's public half (64 hex digits); it signed this manifest.
        admission: ``open``, ``allowlist`` or ``token``.
        allowlist: admitted peer IDs (``allowlist``).
        software: the ``swarmtrain`` version that made the run.
        settings: the run-wide config (:data:`RUN_WIDE` sections), as ``load_config``'s base layer.
        initial_state_hash: digest of the initial parameters (``None``: not known when it was made).
        created: Unix time it was signed.
    """

    run_id: str
    run_public_key: str
    admission: str
    software: str
    settings: dict[str, Any] = field(default_factory=dict)
    allowlist: tuple[str, ...] = ()
    initial_state_hash: str | None = None
    created: float = 0.0

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "run_id": self.run_id,
            "run_public_key": self.run_public_key,
            "admission": self.admission,
            "allowlist": list(self.allowlist),
            "software": self.software,
            "settings": self.settings,
            "initial_state_hash": self.initial_state_hash,
            "created": self.created,
        }

    @property
    def reducer(self) -> tuple[str, int]:
        peers = self.settings.get("peers", {})
        return str(peers.get("reducer", "mean")), int(peers.get("byzantine_f", 0))


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sign_manifest(key: Any, manifest: RunManifest) -> bytes:
    """The signed document of ``manifest`` (``key``: a :class:`peers.trust.admission.RunKey`).

    Raises:
        ConfigError: the key is not the manifest's, or the manifest is not valid (checked by parsing
            what was signed, so a creator cannot write a manifest its peers would refuse).
    """
    from swarmtrain.core.errors import ConfigError

    if key.public_hex != manifest.run_public_key:
        raise ConfigError("the run key is not the one the manifest names")
    body = manifest.body()
    body["created"] = manifest.created or time.time()
    signature = key.sign(_DOMAIN + _canonical(body))
    doc = json.dumps({"manifest": body, "signature": signature.hex()}, indent=1, sort_keys=True).encode()
    try:
        parse_manifest(doc)
    except ProtocolError as e:
        raise ConfigError(f"this run's manifest would be refused by its peers: {e}") from None
    return doc + b"\n"


def _depth(data: bytes) -> int:
    """Nesting depth of a JSON text (brackets outside strings), without building anything."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _finite(obj: Any) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, Mapping):
        return all(isinstance(k, str) and _finite(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return obj is None or isinstance(obj, str | int | bool)


def _str(body: Mapping[str, Any], key: str, limit: int) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise ProtocolError(f"manifest field {key!r} must be a string of 1-{limit} characters")
    return value


def parse_manifest(data: bytes) -> RunManifest:
    """Check a manifest document (size, depth, schema, signature) and return its content.

    Raises:
        ProtocolError: anything wrong with it (the only exception it raises).
    """
    body, sig_hex = _document(data)
    manifest = RunManifest(
        **_identity(body),
        allowlist=_allowlist(body),
        settings=_settings(body),
        initial_state_hash=_state_hash(body),
        created=_created(body),
    )
    _verify(manifest.run_public_key, sig_hex, body)
    _check_policy(manifest)
    return manifest


def _document(data: bytes) -> tuple[dict[str, Any], str]:
    """The body and signature of a bounded JSON document of this format (not verified yet)."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_MANIFEST_BYTES:
        raise ProtocolError(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes")
    if _depth(bytes(data)) > MAX_DEPTH:
        raise ProtocolError(f"the manifest nests deeper than {MAX_DEPTH} levels")
    try:
        doc = json.loads(bytes(data).decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"the manifest is not JSON: {type(e).__name__}") from None
    if not isinstance(doc, dict) or set(doc) != {"manifest", "signature"}:
        raise ProtocolError("a manifest document has exactly the keys 'manifest' and 'signature'")
    body, sig_hex = doc["manifest"], doc["signature"]
    if not isinstance(body, dict) or not _finite(body):
        raise ProtocolError("the manifest body must be an object of finite JSON values")
    if not isinstance(sig_hex, str) or len(sig_hex) != 128 or not _HEX.match(sig_hex):
        raise ProtocolError("the manifest signature must be 128 hex digits")
    if body.get("format") != FORMAT:
        raise ProtocolError(f"manifest format {body.get('format')!r} is not {FORMAT} (another release?)")
    return body, sig_hex


def _identity(body: Mapping[str, Any]) -> dict[str, str]:
    """The run's ID, run key, admission policy and software version."""
    from swarmtrain.core.config import RUN_ID_PATTERN

    run_id = _str(body, "run_id", 64)
    if not RUN_ID_PATTERN.match(run_id):
        raise ProtocolError("the manifest's run ID is not valid")
    public = _str(body, "run_public_key", 64)
    if len(public) != 64 or not _HEX.match(public):
        raise ProtocolError("the manifest's run_public_key must be 64 hex digits")
    admission = _str(body, "admission", 16)
    if admission not in ("open", "allowlist", "token"):
        raise ProtocolError(f"unknown admission policy {admission!r} in the manifest")
    software = _str(body, "software", 32)
    return {"run_id": run_id, "run_public_key": public, "admission": admission, "software": software}


def _allowlist(body: Mapping[str, Any]) -> tuple[str, ...]:
    allowlist = body.get("allowlist")
    if not isinstance(allowlist, list) or len(allowlist) > 1024:
        raise ProtocolError("the manifest's allowlist must be a list of at most 1024 peer IDs")
    if not all(isinstance(p, str) and _PEER_ID.match(p) for p in allowlist):
        raise ProtocolError("the manifest's allowlist holds something that is not a peer ID")
    return tuple(allowlist)


def _settings(body: Mapping[str, Any]) -> dict[str, Any]:
    """The run-wide settings: only the :data:`RUN_WIDE` sections and fields, each section an object."""
    settings = body.get("settings")
    if not isinstance(settings, dict) or not set(settings) <= set(RUN_WIDE):
        raise ProtocolError(f"the manifest's settings may hold only {', '.join(RUN_WIDE)}")
    if not all(isinstance(v, dict) for v in settings.values()):
        raise ProtocolError("each section of the manifest's settings must be an object")
    for section, fields in RUN_WIDE.items():
        if fields is not None and not set(settings.get(section, {})) <= set(fields):
            raise ProtocolError(f"the manifest's [{section}] may set only {', '.join(fields)}")
    return settings


def _state_hash(body: Mapping[str, Any]) -> str | None:
    state_hash = body.get("initial_state_hash")
    if state_hash is not None and (not isinstance(state_hash, str) or not 0 < len(state_hash) <= 128):
        raise ProtocolError("the manifest's initial_state_hash must be a string of at most 128 characters")
    return state_hash


def _created(body: Mapping[str, Any]) -> float:
    created = body.get("created")
    if not isinstance(created, int | float) or isinstance(created, bool):
        raise ProtocolError("the manifest's created time must be a number")
    return float(created)


def _check_policy(manifest: RunManifest) -> None:
    """The ``[peers]`` settings agree with the manifest's run ID and admission, and an open run has a
    robust reducer."""
    peers = manifest.settings.get("peers", {})
    run_id, admission = manifest.run_id, manifest.admission
    if peers.get("run_id", run_id) != run_id or peers.get("admission", admission) != admission:
        raise ProtocolError("the manifest's [peers] settings contradict its run ID or admission")
    reducer, f = manifest.reducer
    if not isinstance(reducer, str) or isinstance(f, bool):
        raise ProtocolError("the manifest's reducer settings are not valid")
    problem = open_policy_problem(admission, reducer, f)
    if problem is not None:
        raise ProtocolError(f"the manifest is not safe to join: {problem}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _verify(public_hex: str, sig_hex: str, body: Mapping[str, Any]) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))
        key.verify(bytes.fromhex(sig_hex), _DOMAIN + _canonical(body))
    except (InvalidSignature, ValueError) as e:
        raise ProtocolError(f"the manifest's signature does not verify ({type(e).__name__})") from None


def read_manifest_file(path: str | os.PathLike[str]) -> RunManifest:
    """The checked manifest in a local file (config ``peers.manifest``).

    Raises:
        ConfigError: one line: the file cannot be read or is not a valid manifest.
    """
    from swarmtrain.core.errors import ConfigError

    p = Path(path).expanduser()
    try:
        return parse_manifest(p.read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read the run manifest {p}: {e.strerror}") from None
    except ProtocolError as e:
        raise ConfigError(f"{p} is not a valid run manifest: {e}") from None
