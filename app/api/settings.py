"""Settings: one validated object, read from ``LAYERBANK_*`` environment
variables; every command-line flag overrides its twin.

Nothing else in layerbank reads ``os.environ``. The API gets settings through
``get_settings()`` (cached, overridable in tests); workers receive them in
their constructor.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from layerbank.cache.keys import PrecisionChoice
from layerbank.cache.poolings import DEFAULT_POOLINGS, POOLING_NAMES, PoolingName, parse_poolings

__all__ = ["DEFAULT_DATA_DIR", "EMBEDDED_MODEL", "Settings", "get_settings"]

DEFAULT_DATA_DIR = Path("layerbank-data")
EMBEDDED_MODEL = "embedded"  # in a list of models: the bundled all-MiniLM-L6-v2


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LAYERBANK_", extra="ignore")

    # where everything lives
    data_dir: Path = Field(DEFAULT_DATA_DIR, description="catalog, shards, heads (relative to cwd)")

    # None: data_dir/catalog.sqlite, one server per directory; postgresql://...: one catalog
    # for several API replicas sharing the shard directory (docs/operations.md)
    catalog_url: str | None = Field(None, description="PostgreSQL catalog for replicas "
                                    "(postgresql://user@host/db); empty = SQLite in the data directory")

    # the encoder and what changes the stored numbers
    model: str | None = Field(None, description="model name or path; empty = embedded all-MiniLM-L6-v2")
    # several encoders in one server (docs/operations.md): the first is the default, the others
    # load on first use; "embedded" names the bundled model
    models: str = Field("", description="models served, comma-separated; the first is the default "
                        "(--model given more than once)")
    model_memory_mb: int | None = Field(None, ge=1, description="memory for loaded encoders' weights; "
                                        "the least recently used is unloaded to stay within it "
                                        "(default: half of the device's memory)")
    device: str = "auto"
    precision: PrecisionChoice = "default"
    # what runs the forward pass on a CPU at fp32: torch, ONNX Runtime, or the faster of the two as
    # measured at first start (workers/engines/); not part of the key: rows agree within 1e-4
    engine: Literal["auto", "torch", "onnx"] = "auto"
    max_length: int | None = Field(None, ge=2)
    storage_dtype: Literal["float16", "float32", "int8"] = "float16"
    # not part of the key: a text stored without a pooling set later is encoded again for it
    poolings: str = Field(DEFAULT_POOLINGS, description="poolings stored per text, comma-separated, "
                          "from: " + ", ".join(POOLING_NAMES))
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores)")

    # batching
    max_tokens_per_batch: int | None = Field(
        None, ge=64, description="padded tokens per encoder batch (default: 4096 on CPU, 16384 on CUDA)")
    part_size: int = Field(2048, ge=1, description="texts per shard")
    batch_window_ms: float = Field(5.0, ge=0, le=1000)

    # the HTTP service
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = None
    insecure: bool = False
    catalog_check_seconds: float = Field(300.0, gt=0, description="how often the API runs SQLite's "
                                         "quick_check on the catalog (/ready is 503 on damage)")
    allowed_hosts: str = Field("", description="host names a keyless server answers to besides loopback "
                                                "names and --host, comma-separated; '*' = any")
    default_view: str = "layer:-2"
    default_pooling: PoolingName = "mean"
    max_texts_per_request: int = Field(2048, ge=1)
    max_chars_per_text: int = Field(100_000, ge=1)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_queue_depth: int = Field(64, ge=1, description="extraction requests waiting at once")
    # slow clients (app/api/slow_clients.py): a request's headers, then its body, must arrive
    # within these, or the connection is closed; an idle kept-alive connection closes after keep_alive_s
    header_timeout_s: float = Field(10.0, ge=0, description="seconds for a request's headers "
                                    "(0: no limit)")
    body_timeout_s: float = Field(60.0, ge=0, description="seconds for a request's whole body "
                                  "(0: no limit)")
    keep_alive_s: float = Field(5.0, ge=1, description="an idle kept-alive connection closes after this")
    max_dataset_texts: int = Field(1_000_000, ge=1)
    probe_processes: int = Field(1, ge=1)
    # what one probe, head or regimes job may hold (app/probes/memory_cost.py): a request whose
    # estimate exceeds it is a 413, and each probe process runs under an address-space limit of
    # this plus PROBE_PROCESS_OVERHEAD_MB (imports, allocator slack)
    probe_memory_mb: int = Field(8192, ge=64, description="memory one probe, head or regimes job may "
                                 "use; a request estimated over it is refused (413) and a probe "
                                 "process that grows past it fails its job")

    # jobs
    backend: Literal["embedded", "ray"] = "embedded"
    ray_address: str | None = None
    ray_actors: int = Field(1, ge=1)
    lease_seconds: float = Field(30.0, gt=0)
    heartbeat_seconds: float = Field(5.0, gt=0)
    max_attempts: int = Field(3, ge=1)

    log_level: str = "INFO"

    @field_validator("model", "api_key", "ray_address", "catalog_url", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @model_validator(mode="before")
    @classmethod
    def _several_models(cls, data: object) -> object:
        """``--model`` given more than once arrives as a list: the first is the default."""
        if isinstance(data, dict) and isinstance(data.get("model"), (list, tuple)):
            names = [str(m) for m in data["model"]]
            data = {**data, "model": names[0] if names else None}
            if len(names) > 1:
                data["models"] = ",".join(names)
        return data

    @model_validator(mode="after")
    def _default_model_first(self) -> "Settings":
        served = [m.strip() for m in self.models.split(",") if m.strip()]
        if self.model is not None:  # named on its own (--model, LAYERBANK_MODEL): the default
            served = [self.model] + [m for m in served if m != self.model]
        if served:
            self.model = None if served[0] == EMBEDDED_MODEL else served[0]
            self.models = ",".join(dict.fromkeys(served)) if len(set(served)) > 1 else ""
        return self

    @property
    def served_models(self) -> list[str | None]:
        """Every model this server serves, the default first (None: the embedded model)."""
        names = [m for m in self.models.split(",") if m] or [self.model or EMBEDDED_MODEL]
        return [None if m == EMBEDDED_MODEL else m for m in names]

    @field_validator("poolings", mode="before")
    @classmethod
    def _known_poolings(cls, v: object) -> object:
        return ",".join(parse_poolings(v)) if isinstance(v, (str, list, tuple)) else v

    @model_validator(mode="after")
    def _default_pooling_is_stored(self) -> "Settings":
        if self.default_pooling not in self.pooling_names:
            raise ValueError(f"default_pooling {self.default_pooling!r} is not among the poolings "
                             f"stored ({self.poolings})")
        return self

    @property
    def pooling_names(self) -> tuple[str, ...]:
        return parse_poolings(self.poolings)

    def extraction_options(self) -> dict[str, object]:
        """What the encoder needs to reproduce the same keys (and the poolings it stores)."""
        return {"device": self.device, "precision": self.precision, "max_length": self.max_length,
                "storage_dtype": self.storage_dtype, "poolings": self.poolings, "engine": self.engine}


@lru_cache
def get_settings() -> Settings:
    return Settings()
