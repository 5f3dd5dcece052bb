"""Human-readable quantities for tables and log lines."""

from __future__ import annotations

__all__ = ["human_bytes", "short_count"]


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def short_count(n: int) -> str:
    """A count in at most 6 characters: ``999`` -> ``"999"``, ``81920`` -> ``"81.9k"``,
    ``1_234_567`` -> ``"1.23M"``, then ``G``, ``T``, ``P``, ``E`` (decimal units)."""
    if n < 1000:
        return str(n)
    x = float(n)
    for unit in ("k", "M", "G", "T", "P", "E"):
        x /= 1000
        if x < 999.5 or unit == "E":
            return f"{x:.3g}{unit}" if x < 100 else f"{x:.0f}{unit}"
    return str(n)  # pragma: no cover
