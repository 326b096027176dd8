"""httpx, which the HTTP clients need (the ``client`` extra): imported here
once, so that without it the error names the extra to install."""

from __future__ import annotations

try:
    import httpx
except ModuleNotFoundError as _missing:  # pragma: no cover - the dev extra installs httpx
    if _missing.name != "httpx":
        raise
    raise ModuleNotFoundError(
        "the HTTP clients need httpx: pip install 'a2trio[client]'", name="httpx"
    ) from _missing

__all__ = ["httpx"]
