"""Name -> class registries, so config files, the CLI and code use the same words for components.

``CODECS`` is the one registry of tensor codecs. It lives in the core, below ``compression``, because
the wire's codec allow-list (``swarmtrain.core.wire.WIRE_CODECS``) is derived from it: a codec
registered once (by ``compression`` itself, or by a plugin through the ``swarmtrain.codecs`` entry
point, see ``compression.plugins``) is buildable by name, allowed on the wire and listed by the
benchmark, with no second list to keep in step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from typing import Generic, TypeVar

from swarmtrain.core.errors import ConfigError

__all__ = ["Registry", "CodecRegistry", "CODECS", "NamesView"]

T = TypeVar("T")


class Registry(Generic[T]):
    """A case-sensitive mapping from a short name to a factory (usually a class).

    Example:
        >>> CODECS: Registry[type] = Registry("codec")
        >>> @CODECS.register("none")
        ... class Identity: ...
        >>> CODECS.get("none") is Identity
        True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a second registration of a name is an error."""

        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ConfigError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the entry for ``name`` or raise ``ConfigError`` listing the valid choices."""
        try:
            return self._items[name]
        except KeyError:
            choices = ", ".join(sorted(self._items)) or "(none registered)"
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of: {choices}") from None

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """All registered names in registration order."""
        return list(self._items)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (tests; a plugin that must be withdrawn). Unknown names are ignored."""
        self._items.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


#: codec names: what a packet's ``codec`` field may say (the wire caps names at 64 characters).
_CODEC_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


class CodecRegistry(Registry[type]):
    """The codec registry: names are also wire names, so they are short lowercase words.

    ``+`` is reserved for composites: a registered class may define a classmethod
    ``composite_names(registry) -> Iterable[str]`` listing the names it also decodes (top-k:
    ``topk+<value codec>``); a class with a true ``value_codec`` attribute may carry top-k values.
    """

    def register(self, name: str) -> Callable[[type], type]:
        """Decorator registering a codec class under ``name``.

        Raises:
            ConfigError: ``name`` is not 1-64 characters of ``[a-z0-9_.-]`` starting with a letter or
                digit, or is taken by another class.
        """
        if not isinstance(name, str) or _CODEC_NAME.fullmatch(name) is None:
            raise ConfigError(
                f"codec name {str(name)[:80]!r} must be 1-64 characters of a-z, 0-9, '_', '.', '-' "
                "('+' joins composites)"
            )
        return super().register(name)

    def value_names(self) -> list[str]:
        """Names of the codecs that may carry top-k values, in registration order."""
        return [n for n in self.in_order() if getattr(self._items[n], "value_codec", False)]

    def wire_names(self) -> frozenset[str]:
        """Every codec name a packet may carry: each registered name and its composites."""
        out: set[str] = set()
        for name, cls in list(self._items.items()):
            out.add(name)
            composites = getattr(cls, "composite_names", None)
            if callable(composites):
                out.update(str(n) for n in composites(self))
        return frozenset(out)


CODECS = CodecRegistry("codec")


class NamesView(AbstractSet[str]):
    """A live, read-only set of names computed on each use (e.g. ``CODECS.wire_names``).

    Iteration is sorted; indexing reads the sorted list, so it also serves where a sequence is
    expected (``list(view)``, ``view[0]``).
    """

    def __init__(self, names: Callable[[], Iterable[str]], *, ordered: bool = False) -> None:
        self._names = names
        self._ordered = ordered

    def _list(self) -> list[str]:
        names = list(dict.fromkeys(self._names()))
        return names if self._ordered else sorted(names)

    def __contains__(self, name: object) -> bool:
        return name in set(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._list())

    def __len__(self) -> int:
        return len(self._list())

    def __getitem__(self, i: int) -> str:
        return self._list()[i]

    def __repr__(self) -> str:
        return f"NamesView({self._list()!r})"
