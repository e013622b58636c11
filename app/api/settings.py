"""The API's settings dependency: ``get_settings()`` for ``Depends`` (cached,
overridable in tests with ``app.dependency_overrides``).

The declaration itself lives in ``layerbank/settings.py``, outside the HTTP
package, so the command line, ``layerbank.Bank`` and the worker read settings
without importing FastAPI; its names are re-exported here for the routes.
"""

from __future__ import annotations

from functools import lru_cache

from layerbank.settings import DEFAULT_DATA_DIR, EMBEDDED_MODEL, Settings

__all__ = ["DEFAULT_DATA_DIR", "EMBEDDED_MODEL", "Settings", "get_settings"]


@lru_cache
def get_settings() -> Settings:
    return Settings()
