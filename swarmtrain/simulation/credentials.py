"""Admission for a simulated run: identities, and the run key and tokens its policy needs.

``swarmtrain simulate`` runs as a real run made by ``swarmtrain run init`` would: under ``token`` (its
default) it makes a run key in a private folder and issues every peer (and the bootstrap node) a
join token for its own identity; under ``allowlist`` it lists their peer IDs; ``open`` needs nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

from swarmtrain.core.config import Config

__all__ = ["admitted_configs"]

_TOKEN_HOURS = 24.0


def admitted_configs(
    cfg: Config, n_peers: int, folder: Path, colluders: int = 0
) -> tuple[Config, list[Config]]:
    """The bootstrap's config and one per rank, each with its identity file in ``folder`` and what
    ``cfg.peers.admission`` asks for (a run key's public half and a token, or the allowlist).
    ``colluders``: that many more configs after the ranks', admitted alike (``simulate --colluders``).

    Raises:
        ConfigError: a key or identity file cannot be written.
    """
    from peers.keys.identity import ensure_identity
    from peers.trust.admission import RunKey, encode_token_text

    names = ["bootstrap", *(f"peer{r}" for r in range(n_peers)), *(f"colluder{i}" for i in range(colluders))]
    paths = {name: folder / f"{name}.key" for name in names}
    ids = {name: ensure_identity(p) for name, p in paths.items()}
    peers = cfg.peers
    shared: dict[str, object] = {}
    tokens: dict[str, str] = {}
    if peers.admission == "allowlist":
        shared["allowlist"] = sorted({*peers.allowlist, *ids.values()})
    elif peers.admission == "token":
        key = RunKey.generate(folder / "run.key")
        shared["run_public_key"] = key.public_hex
        expires = time.time() + _TOKEN_HOURS * 3600
        tokens = {n: encode_token_text(key.issue(peers.run_id, ids[n], expires)) for n in names}
    out = []
    for name in names:
        c = cfg.model_copy(deep=True)
        # keys made here are nobody else's: no check at start (it runs a daemon of its own per peer)
        own = {"identity_path": str(paths[name]), "identity_check": False, "token": tokens.get(name)}
        c.peers = peers.model_copy(update={**shared, **own})
        out.append(c)
    return out[0], out[1:]
