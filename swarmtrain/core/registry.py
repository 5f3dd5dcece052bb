"""Name -> class registries, so config files, the CLI and code use the same words for components."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from swarmtrain.core.errors import ConfigError

__all__ = ["Registry"]

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

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
