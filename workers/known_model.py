"""A model the catalog already knows: its keys made without torch or weights.

A cache key is ``sha256(fingerprint | extraction config | text)``. The
fingerprint comes from the model's files (``layerbank.cache.fingerprint``);
the config needs three things the encoder learns when it loads: the model's
longest input, what the requested precision resolves to on this device, and
the device itself. The encoder publishes them in the catalog's models
table (``model_max_length``, ``precision_modes``, ``device``; on a CPU,
``auto`` is known only from a row whose encoder measured it,
``precision_choice``), so a
later run can make the same config, look its texts up, and load nothing
when every text is stored: a cached rerun of README's first command went
from 17-29 s (torch import and weight loading first) to about a second.

``known_model`` returns None whenever it cannot be sure the config is the
one the encoder would make (model never registered, another device type,
a catalog row from before ``model_max_length``); callers then load the
encoder, which registers the model for next time. A wrong guess here
would not return wrong numbers, only miss the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerbank.cache.catalog import Catalog
from layerbank.cache.keys import ExtractionConfig

__all__ = ["ModelRef", "expected_config", "known_model"]

# present only where the NVIDIA driver is loaded; without it torch cannot see a GPU
_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True)
class ModelRef:
    """What keys and reads need of a model: the encoder's ``fingerprint``,
    ``config`` and ``info``, without the encoder."""

    name: str
    fingerprint: str
    config: ExtractionConfig
    info: dict[str, Any]

    @property
    def n_hidden_states(self) -> int:
        return int(self.info["n_hidden_states"])


def _device_type(device: str) -> str | None:
    """The torch device type ``device`` resolves to, when that is certain without torch."""
    if device == "cpu" or device.startswith("cuda"):
        return device.split(":")[0]
    if device == "auto" and not _NVIDIA_DRIVER.exists():
        return "cpu"
    return None  # auto on a machine with a GPU driver: only torch knows whether CUDA works


def expected_config(info: dict[str, Any], *, device: str = "auto", precision: str = "default",
                    max_length: int | None = None,
                    storage_dtype: str = "float16") -> ExtractionConfig | None:
    """The config ``Encoder.load`` would make with these options, from the
    model's registered ``info``; None when it cannot be known without loading."""
    dev = _device_type(device)
    model_max = info.get("model_max_length")
    if dev is None or info.get("device") != dev or not isinstance(model_max, int):
        return None
    if precision == "auto" and dev == "cpu" and "precision_choice" not in info:
        # on a CPU, auto is what a calibration measured (workers/engines/choice.py); only
        # a row registered by an encoder that applied it knows the answer
        return None
    resolved = (info.get("precision_modes") or {}).get(precision)
    if resolved is None:  # unknown mode, or not available here: the encoder says why
        return None
    try:
        return ExtractionConfig(max_length=min(max_length or model_max, model_max),
                                storage_dtype=storage_dtype, precision=resolved)
    except ValueError:  # a bad option: the encoder reports it
        return None


def known_model(catalog: Catalog, name: str, fingerprint: str, *, device: str = "auto",
                precision: str = "default", max_length: int | None = None,
                storage_dtype: str = "float16") -> ModelRef | None:
    """The model as registered in ``catalog`` with the config these options give, or None."""
    info = catalog.model_info(fingerprint)
    if info is None:
        return None
    cfg = expected_config(info, device=device, precision=precision, max_length=max_length,
                          storage_dtype=storage_dtype)
    if cfg is None:
        return None
    # the row describes the last run's settings; this run's may differ
    info = {**info, "max_length": cfg.max_length, "precision": cfg.precision,
            "storage_dtype": storage_dtype, "config": cfg.canonical()}
    return ModelRef(name, fingerprint, cfg, info)
