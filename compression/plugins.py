"""Third-party codecs through Python entry points (group ``swarmtrain.codecs``).

A distribution adds a codec by declaring, in its ``pyproject.toml``::

    [project.entry-points."swarmtrain.codecs"]
    mycodec = "mypackage.codecs:MyCodec"

where ``MyCodec`` subclasses ``compression.Codec`` and its ``name`` equals the entry point's name
(the name packets carry). ``load_codec_plugins()`` (run once when ``compression`` is imported)
registers each such class in ``CODECS``; from then on the codec is built by name from config
(``compression.codec``, with its constructor options from ``compression.options``), allowed on the
wire (``swarmtrain.core.wire.WIRE_CODECS`` derives from the registry), listed by the benchmark and,
with ``value_codec = True``, usable as ``topk+mycodec``.

Trust. Only code installed in this environment is loaded, never anything a peer names: a packet's
codec name is still checked against the registry, so a peer cannot make this process import
anything. A plugin's decoder receives untrusted packets and must raise ``ProtocolError`` on any
inconsistency, as the built-in ones do. A plugin that fails to load, is not a ``Codec`` or clashes
with a registered name is skipped with one warning; the run goes on with the other codecs.
"""

from __future__ import annotations

import importlib.metadata
import logging

from compression.base import CODECS, Codec
from swarmtrain.core.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "load_codec_plugins"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "swarmtrain.codecs"


def load_codec_plugins() -> list[str]:
    """Register the codecs of every installed ``swarmtrain.codecs`` entry point not registered yet.

    Returns:
        The names registered by this call (sorted).
    """
    added: list[str] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in CODECS:
            continue  # loaded before, or a built-in name (which a plugin cannot replace)
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin must not stop the run
            logger.warning("codec plugin %r (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        if not (isinstance(obj, type) and issubclass(obj, Codec)):
            logger.warning(
                "codec plugin %r (%s) is not a compression.Codec subclass; skipped", ep.name, ep.value
            )
            continue
        if getattr(obj, "name", None) != ep.name:
            logger.warning(
                "codec plugin %r (%s) names its packets %r; the entry point must use the same name; skipped",
                ep.name,
                ep.value,
                getattr(obj, "name", None),
            )
            continue
        try:
            CODECS.register(ep.name)(obj)
        except ConfigError as e:
            logger.warning("codec plugin %r (%s) skipped: %s", ep.name, ep.value, e)
            continue
        added.append(ep.name)
    return sorted(added)
