"""The ``swarmtrain`` command line (typer).

Every command's errors that come from the user (bad flags, bad config files, bad values) print one
line, ``swarmtrain: error: ...``, and exit with status 2, with no traceback. A run's errors
(``SwarmError``, a peer's included) print one line too and exit with status 1; with ``-v`` each of
these errors prints its traceback above its line: a peer process's own traceback
(``swarmtrain.core.peer_error``), not the parent's re-raise.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

import typer

from swarmtrain.core import __version__
from swarmtrain.core.errors import ConfigError, SwarmError

try:  # typer >= 0.20 vendors click as typer._click; older ones use click itself
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover
    from click import exceptions as _cx  # type: ignore[no-redef]

__all__ = ["app", "main"]

# Sub-command modules, each with ``register(app: typer.Typer) -> None``.
COMMAND_MODULES: tuple[str, ...] = (
    "swarmtrain.app.commands.train",
    "swarmtrain.app.commands.peers",
    "swarmtrain.app.commands.simulate",
    "swarmtrain.app.commands.join",
    "swarmtrain.app.commands.bench",
    "swarmtrain.app.commands.trust",
    "swarmtrain.app.commands.doctor",
    "swarmtrain.app.commands.dashboard",
)

#: the global flags of this invocation, set by ``_root`` (``run`` reads ``verbose`` for its errors)
_flags = {"verbose": False}

app = typer.Typer(
    name="swarmtrain",
    help="Train neural networks across many poorly connected machines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"swarmtrain {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log at DEBUG level; an error shows its traceback (a peer's own)."
    ),
) -> None:
    """Train neural networks across many poorly connected machines."""
    from swarmtrain.app.logs import quiet_third_party

    _flags["verbose"] = verbose

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    quiet_third_party(verbose)


for _mod in COMMAND_MODULES:
    importlib.import_module(_mod).register(app)


def _fail(message: str, code: int) -> int:
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    print(f"swarmtrain: error: {first}", file=sys.stderr)
    return code


def _fail_error(e: SwarmError, code: int) -> int:
    """``e``'s one line; with ``-v`` its traceback first (a peer's own for a peer's error)."""
    if _flags["verbose"]:
        from swarmtrain.core.peer_error import error_traceback

        text = error_traceback(e).rstrip()
        if text:
            print(text, file=sys.stderr)
    return _fail(str(e), code)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status (used by ``main`` and by tests)."""
    command = typer.main.get_command(app)
    _flags["verbose"] = False
    try:
        args = list(argv) if argv is not None else sys.argv[1:]
        rv = command.main(args=args, prog_name="swarmtrain", standalone_mode=False)
    except typer.Exit as e:
        return int(e.exit_code)
    except _cx.NoArgsIsHelpError as e:
        print(e.format_message())
        return 0
    except typer.Abort:
        return _fail("aborted", 130)
    except _cx.UsageError as e:
        return _fail(e.format_message(), 2)
    except _cx.ClickException as e:
        return _fail(e.format_message(), 2)
    except ConfigError as e:
        return _fail_error(e, 2)
    except SwarmError as e:
        return _fail_error(e, 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return int(rv) if isinstance(rv, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
