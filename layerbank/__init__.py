"""layerbank: run a frozen encoder once, keep every layer in HDF5, answer from that store.

The public surface, imported lazily so that ``import layerbank`` loads
neither torch, transformers nor scikit-learn:

    layerbank.Client      the HTTP client of a running server (httpx + numpy)
    layerbank.Bank        the same features and probes in-process, without a server
    layerbank.LayerFeatures  a scikit-learn transformer: a grid search can choose the layer
    layerbank.ApiError    what the client raises; str() carries the server's message
                          (JobFailed, JobTimeout: its subclasses for jobs)

Installed, the repository's folders live under this one namespace:
``app/`` is ``layerbank.app``, ``workers/`` is ``layerbank.workers`` and
``cache/`` is ``layerbank.cache`` (pyproject.toml maps them), so a user's
own ``app`` or ``cache`` package is never shadowed.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# public name -> module that defines it; loaded on first attribute access
_LAZY = {
    "Client": "layerbank.app.client",
    "ApiError": "layerbank.app.client",
    "JobFailed": "layerbank.app.client",
    "JobTimeout": "layerbank.app.client",
    "Bank": "layerbank.app.bank",
    "LayerFeatures": "layerbank.app.layer_features",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerbank' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
