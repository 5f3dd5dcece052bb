"""A command's flags, declared once: as the fields of its options dataclass.

Each field made by :func:`flag` is one flag: its name, type and default are the field's; its option
names, help and bounds (``typer.Option``'s arguments) and the dotted config key it sets, if any, are
the field's metadata (a field made by :func:`argument` is a positional argument, the command's own).
:func:`command` makes the typer command from those fields and :func:`config_overrides` the config's
highest layer, so a flag cannot be added to one and missed by the other.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import typer

__all__ = [
    "FlagSpec",
    "flag",
    "argument",
    "flag_specs",
    "config_overrides",
    "given_flags",
    "command",
    "options_of",
]

T = TypeVar("T")

_META = "flag"
_OPTIONS = "__flag_options__"


@dataclass(frozen=True)
class FlagSpec:
    """How a field is given on the command line.

    Attributes:
        decls: the option names, e.g. ``("--peers", "-n")``.
        key: the dotted config key it sets (``None``: the command's own, read from the options).
        options: ``typer.Option``'s other arguments (``help``, ``min``, ``max``, ``metavar``).
        convert: what the config key gets from a given value (``None``: the value itself).
        positional: a command-line argument (``typer.Argument``; no option names), not an option.
    """

    decls: tuple[str, ...]
    key: str | None
    options: dict[str, Any]
    convert: Callable[[Any], Any] | None = None
    positional: bool = False


def flag(
    default: Any,
    *decls: str,
    key: str | None = None,
    convert: Callable[[Any], Any] | None = None,
    **options: Any,
) -> Any:
    """A dataclass field that is the flag ``decls`` (``typer.Option(default, *decls, **options)``),
    setting the config key ``key`` (to ``convert(value)`` with ``convert``) when given."""
    return field(default=default, metadata={_META: FlagSpec(decls, key, options, convert)})


def argument(default: Any, **options: Any) -> Any:
    """A dataclass field that is a positional argument (``typer.Argument(default, **options)``): the
    command's own, setting no config key."""
    return field(default=default, metadata={_META: FlagSpec((), None, options, positional=True)})


def _parameter(name: str, spec: FlagSpec, default: Any, annotation: Any) -> inspect.Parameter:
    """The typer parameter of one field."""
    make: Callable[..., Any] = typer.Argument if spec.positional else typer.Option
    return inspect.Parameter(
        name,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=make(default, *spec.decls, **spec.options),
        annotation=annotation,
    )


def flag_specs(cls: type) -> dict[str, FlagSpec]:
    """Field name -> its :class:`FlagSpec`, in declaration order.

    Raises:
        TypeError: a field of ``cls`` is not a :func:`flag`.
    """
    out: dict[str, FlagSpec] = {}
    for f in fields(cls):
        if _META not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not a flag()")
        out[f.name] = f.metadata[_META]
    return out


def config_overrides(opts: Any) -> dict[str, Any]:
    """The flags of ``opts`` (a dataclass of :func:`flag` fields) that set a config key, as
    ``load_config``'s overrides: ``None`` (or an empty repeatable flag) is a flag not given."""
    out: dict[str, Any] = {}
    for name, spec in flag_specs(type(opts)).items():
        if spec.key is None:
            continue
        value = getattr(opts, name)
        if value is not None and spec.convert is not None:
            value = spec.convert(value)
        if isinstance(value, list | tuple):
            value = list(value) or None
        out[spec.key] = value
    return out


def command(options: type[T]) -> Callable[[Callable[[T], None]], Callable[..., None]]:
    """Decorate ``body(opts)`` into a typer command whose parameters are the flags of ``options``
    (its help: ``body``'s docstring)."""
    hints = typing.get_type_hints(options)
    defaults = {f.name: f.default for f in fields(options)}  # type: ignore[arg-type]
    params = [
        _parameter(name, spec, defaults[name], hints[name]) for name, spec in flag_specs(options).items()
    ]

    def wrap(body: Callable[[T], None]) -> Callable[..., None]:
        @functools.wraps(body)
        def cmd(**flags: Any) -> None:
            body(options(**flags))

        cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        cmd.__annotations__ = {p.name: p.annotation for p in params}
        setattr(cmd, _OPTIONS, options)
        return cmd

    return wrap


def options_of(cmd: Callable[..., Any]) -> type | None:
    """The options dataclass ``cmd`` was made from by :func:`command` (``None``: not made so)."""
    options = getattr(cmd, _OPTIONS, None)
    return options if isinstance(options, type) else None


def given_flags(opts: Any, sections: tuple[str, ...], but: tuple[str, ...] = ()) -> list[str]:
    """The flags given in ``opts`` (not ``None``) that set a key in one of the config ``sections``
    (other than the keys ``but``), by their first name: for a refusal that names them."""
    return [
        spec.decls[0].split("/")[0]
        for name, spec in flag_specs(type(opts)).items()
        if spec.key is not None
        and spec.key.split(".")[0] in sections
        and spec.key not in but
        and getattr(opts, name) is not None
    ]
