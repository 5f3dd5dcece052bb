"""A run's manifest on the app side: making it (``run init``) and joining by it (``join``).

:func:`make_manifest` turns a config into the signed manifest (``peers.trust.manifest``): the run-wide
settings, the admission policy, the software version and the hash of the initial parameters.
:func:`config_from_manifest` is how a volunteer builds its config from a manifest: the manifest's
settings are the lowest layer, the volunteer's own file, environment and flags go on top, and any
run-wide setting that ends up different from the manifest's is refused in one line (so is another
swarmtrain release, or a machine that builds another initial model).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from peers.trust.manifest import RunManifest, compatible_versions, open_policy_problem, run_wide_settings
from swarmtrain.core.config import Config, load_config
from swarmtrain.core.errors import ConfigError

__all__ = [
    "initial_state_hash",
    "make_manifest",
    "config_from_manifest",
    "check_open_policy",
    "check_model_fits",
    "keep_manifest",
]


def initial_state_hash(cfg: Config) -> str | None:
    """Digest of the parameters every peer starts from (``None`` when the vocabulary comes from data
    files, which the run's creator may not hold)."""
    if cfg.data.source == "bin" and cfg.model.vocab_size is None:
        return None
    from swarmtrain.app.models import build_model
    from swarmtrain.app.peer.state import param_digest

    model = build_model(cfg.model, seed=cfg.train.seed)
    return param_digest(dict(model.named_parameters()))


def make_manifest(cfg: Config, key: Any) -> bytes:
    """The signed manifest of the run ``cfg`` describes (``key``: the run's
    :class:`peers.trust.admission.RunKey`).

    Raises:
        ConfigError: an open run without a robust reducer, or a manifest its peers would refuse.
    """
    from peers.trust.manifest import sign_manifest
    from swarmtrain.core import __version__

    p = cfg.peers
    problem = open_policy_problem(p.admission, p.reducer, p.byzantine_f)
    if problem is not None:
        raise ConfigError(problem)
    settings = run_wide_settings(cfg.model_dump(mode="json"))
    settings["peers"]["run_public_key"] = key.public_hex
    manifest = RunManifest(
        run_id=p.run_id,
        run_public_key=key.public_hex,
        admission=p.admission,
        software=__version__,
        settings=settings,
        allowlist=tuple(p.allowlist),
        initial_state_hash=initial_state_hash(cfg),
    )
    return sign_manifest(key, manifest)


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, Mapping) and isinstance(vb, Mapping) and k != "reducer_options":
            out += _differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append((f"{prefix}{k}", va, vb))
    return out


def config_from_manifest(
    manifest: RunManifest,
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> Config:
    """The volunteer's config: ``manifest``'s settings under its own file, environment and flags.

    Raises:
        ConfigError: one line: another swarmtrain release, a run-wide setting that differs from the
            manifest's, a model beyond this machine's free memory, or a machine whose initial model
            differs from the run's.
    """
    from swarmtrain.core import __version__

    if not compatible_versions(manifest.software, __version__):
        raise ConfigError(
            f"run {manifest.run_id!r} runs swarmtrain {manifest.software}; this is {__version__}: "
            f"install a {'.'.join(manifest.software.split('.')[:2])}.x release to join it"
        )
    cfg = load_config(path, overrides, env=env, base=manifest.settings)
    run = load_config(None, {}, env={}, base=manifest.settings)
    diffs = _differences(
        run_wide_settings(run.model_dump(mode="json")), run_wide_settings(cfg.model_dump(mode="json"))
    )
    if diffs:
        key, want, got = diffs[0]
        more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
        raise ConfigError(
            f"run {manifest.run_id!r} sets {key} = {want!r} in its manifest; this peer sets {got!r}{more}: "
            "drop that setting (the manifest carries the run's settings)"
        )
    check_model_fits(cfg, manifest.run_id)  # before the initial model is built
    if manifest.initial_state_hash is not None:
        mine = initial_state_hash(cfg)
        if mine is not None and mine != manifest.initial_state_hash:
            raise ConfigError(
                f"this machine builds another initial model than run {manifest.run_id!r} "
                f"({mine[:12]} vs {manifest.initial_state_hash[:12]}): another torch release?"
            )
    return cfg


def check_model_fits(cfg: Config, run_id: str) -> None:
    """Refuse a run whose model's memory budget exceeds what this machine has free, before anything is
    allocated (a manifest names the model, and an impostor's can name 300 G parameters).

    Raises:
        ConfigError: one line (``swarmtrain.app.train.memory_budget.check_fits``).
    """
    from swarmtrain.app.train.memory_budget import check_fits
    from swarmtrain.app.train.trainer import resolve_device

    check_fits(cfg, resolve_device(cfg.train.device), run_id)


def check_open_policy(cfg: Config) -> None:
    """Refuse admission ``open`` with a reducer any stranger can steer (unless the config opts out
    with ``peers.open_unprotected``, for trusted networks and tests).

    Raises:
        ConfigError: one line saying what to set.
    """
    p = cfg.peers
    problem = open_policy_problem(p.admission, p.reducer, p.byzantine_f)
    if problem is not None and not p.open_unprotected:
        raise ConfigError(f"{problem} (or set peers.open_unprotected = true on a network you trust)")


def keep_manifest(document: bytes) -> str:
    """Write a fetched manifest to a private temporary file (removed at exit) and return its path, so
    this peer serves it to the newcomers that come after it."""
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix="swarmtrain-manifest-")
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / "run.manifest"
    path.write_bytes(document)
    return str(path)
