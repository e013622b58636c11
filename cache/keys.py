"""Content-addressed keys: what identifies one stored feature row.

``key = sha256(model_fingerprint | extraction_config | text)``. Each part is
length-prefixed so that no two different triples hash the same bytes. The text
is hashed exactly as given (no stripping, no Unicode normalisation): two texts
that differ by one space are two keys, because the encoder may see them
differently.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

__all__ = ["ExtractionConfig", "text_key", "STORAGE_DTYPES", "PRECISIONS", "PRECISION_CHOICES",
           "PrecisionChoice"]

STORAGE_DTYPES = ("float16", "float32", "int8")  # int8: cache/int8.py
PRECISIONS = ("fp32", "bf16", "fp16")  # the modes a key records
# what a user may ask for: the modes, and two that resolve to one of them on the
# machine at hand (workers/precision.py); the API, the CLI and the settings read this list
PRECISION_CHOICES = ("default", "auto") + PRECISIONS
if TYPE_CHECKING:  # a Literal built from a tuple, which type checkers cannot follow
    PrecisionChoice = str
else:
    PrecisionChoice = Literal[PRECISION_CHOICES]


@dataclass(frozen=True)
class ExtractionConfig:
    """Everything that changes the stored numbers, and so belongs in the key.

    ``max_length`` is resolved against the model before a key is made (the
    worker replaces ``None`` with the model's maximum), so that "default" and
    "512" never produce two keys for the same numbers.
    """

    max_length: int | None = None
    truncation_side: str = "right"
    add_special_tokens: bool = True
    storage_dtype: str = "float16"
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.truncation_side not in ("right", "left"):
            raise ValueError("truncation_side must be 'right' or 'left'")
        if self.storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {STORAGE_DTYPES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        if self.max_length is not None and not 2 <= self.max_length <= 1_000_000:
            raise ValueError("max_length must be between 2 and 1,000,000")

    def canonical(self) -> str:
        """Stable JSON text used inside keys and shard attributes."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ExtractionConfig:
        return cls(**json.loads(text))


def _part(s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return str(len(b)).encode() + b":" + b


def text_key(model_fingerprint: str, config: ExtractionConfig | str, text: str) -> str:
    """Hex sha256 key of one text for one model and extraction config."""
    cfg = config if isinstance(config, str) else config.canonical()
    h = hashlib.sha256()
    h.update(_part(model_fingerprint))
    h.update(b"|")
    h.update(_part(cfg))
    h.update(b"|")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()
