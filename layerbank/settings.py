"""Settings: the one place layerbank reads its ``LAYERBANK_*`` environment.

Why here, outside ``app/api``: the command line, ``layerbank.Bank``, the
worker process and the catalog (``cache/catalog.py``'s default URL) all need
settings, and none of them should import the HTTP package for it.

What reads the environment, all in this module:

- ``Settings``: one validated object, every field declared once with its
  help text (``Field(description=...)``); the command-line flags, their
  environment twins (``--some-name`` / ``LAYERBANK_SOME_NAME``) and their help
  are generated from it (``app/cli/common.py`` ``add_setting_flags``);
- ``environment_value(name)``: one raw value, for the twin of a command-line
  option that is not a setting (``--text-column``), or a setting read on its
  own where building all of them is not wanted (the catalog's URL);
- ``setting(name)``: one setting read alone and validated as ``Settings``
  would (the PostgreSQL catalog's statement timeout, in ``cache/``, which may
  not import ``layerbank.app``);
- ``settings_env(settings)``: the environment a child process gets, with
  ``settings`` written into it.

tests/unit/test_import_rules.py checks that no other module reads ``os.environ``
for a setting. The API gets settings through ``app/api/settings.py``
``get_settings()`` (a FastAPI dependency, overridable in tests).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from layerbank.cache.keys import PrecisionChoice
from layerbank.cache.poolings import DEFAULT_POOLINGS, POOLING_NAMES, PoolingName, parse_poolings
from layerbank.cache.reader_budget import READER_MEMORY_MB

__all__ = ["DEFAULT_DATA_DIR", "EMBEDDED_MODEL", "ENV_PREFIX", "ExtractionOptions", "Settings", "env_name",
           "environment_value", "setting", "settings_env"]

ENV_PREFIX = "LAYERBANK_"

DEFAULT_DATA_DIR = Path("layerbank-data")
EMBEDDED_MODEL = "embedded"  # in a list of models: the bundled all-MiniLM-L6-v2


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # where everything lives
    data_dir: Path = Field(DEFAULT_DATA_DIR, description="data directory: catalog, shards, heads (default "
                           "layerbank-data, relative to the working directory)")

    # None: data_dir/catalog.sqlite, one server per directory; postgresql://...: one catalog
    # for several API replicas sharing the shard directory (docs/operations.md)
    catalog_url: str | None = Field(None, description="PostgreSQL catalog (postgresql://user@host/db) for "
                                    "several replicas on one shard directory; default: catalog.sqlite in "
                                    "the data directory, one server")

    # the encoder and what changes the stored numbers
    model: str | None = Field(None, description="model name or path (default: embedded all-MiniLM-L6-v2)")
    # several encoders in one server (docs/operations.md): the first is the default, the others
    # load on first use; "embedded" names the bundled model
    models: str = Field("", description="models served, comma-separated; the first is the default "
                        "(--model given more than once)")
    model_memory_mb: int | None = Field(None, ge=1, description="memory for loaded encoders' weights when "
                                        "several models are served; the least recently used is unloaded "
                                        "to stay within it (default: half of the device's memory)")
    device: str = Field("auto", description="cpu, cuda, cuda:N or auto")
    precision: PrecisionChoice = Field("default", description="compute precision; auto: fp32 or bf16, "
                                       "whichever measured faster here (stored in the data directory)")
    # what runs the forward pass on a CPU at fp32: torch, ONNX Runtime, or the faster of the two as
    # measured at first start (workers/engines/); not part of the key: rows agree within 1e-4
    engine: Literal["auto", "torch", "onnx"] = Field(
        "auto", description="what runs the model on a CPU at fp32: torch, ONNX Runtime, or auto (the "
        "faster, timed once per machine; same numbers within 1e-4)")
    max_length: int | None = Field(None, ge=2, description="truncate texts at this many tokens")
    storage_dtype: Literal["float16", "float32", "int8"] = Field(
        "float16", description="dtype of stored vectors (int8: a float32 scale per row per layer, half "
        "float16's bytes; docs/storage.md)")
    # not part of the key: a text stored without a pooling set later is encoded again for it
    poolings: str = Field(DEFAULT_POOLINGS, description="poolings stored per text, comma-separated, "
                          "from: " + ", ".join(POOLING_NAMES) + f" (default: {DEFAULT_POOLINGS})")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores)")

    # batching
    max_tokens_per_batch: int | None = Field(
        None, ge=64, description="padded tokens per encoder batch (default: 4096 on CPU, 16384 on CUDA)")
    part_size: int = Field(2048, ge=1, description="texts per shard (default 2048)")
    batch_window_ms: float = Field(5.0, ge=0, le=1000, description="how long misses wait for others to "
                                   "share an encoder batch (default 5)")

    # the HTTP service
    host: str = Field("127.0.0.1", description="address to listen on (default 127.0.0.1)")
    port: int = Field(8000, ge=0, le=65535, description="port (default 8000; 0 picks a free one)")
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY' on every route "
                                "but /health")
    insecure: bool = Field(False, description="allow a non-loopback host without an API key")
    catalog_check_seconds: float = Field(300.0, gt=0, description="how often the API runs SQLite's "
                                         "quick_check on the catalog (/ready is 503 on damage)")
    allowed_hosts: str = Field("", description="without a key: host names to answer to besides "
                               "loopback and --host (comma-separated; '*' = any)")
    default_view: str = Field("layer:-2", description="view when a request names none (default layer:-2)")
    default_pooling: PoolingName = Field("mean", description="pooling when a request names none "
                                         "(default mean)")
    max_texts_per_request: int = Field(2048, ge=1, description="texts in one request (default 2048)")
    max_chars_per_text: int = Field(100_000, ge=1, description="characters in one text (default 100000)")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="request body size (default 32 MiB)")
    max_queue_depth: int = Field(64, ge=1, description="requests waiting for the encoder, and queued "
                                 "dataset jobs (default 64)")
    # slow clients (app/api/slow_clients.py): a request's headers, then its body, must arrive
    # within these, or the connection is closed; an idle kept-alive connection closes after keep_alive_s
    header_timeout_s: float = Field(10.0, ge=0, description="seconds for a request's headers "
                                    "(0: no limit)")
    body_timeout_s: float = Field(60.0, ge=0, description="seconds for a request's whole body "
                                  "(0: no limit)")
    keep_alive_s: float = Field(5.0, ge=1, description="an idle kept-alive connection closes after this")
    max_dataset_texts: int = Field(1_000_000, ge=1, description="texts in one dataset (default 1000000)")
    # open shard files cost ~0.6 MB each and reopening one ~0.26 ms a read (cache/reader_budget.py):
    # the default suits the tests' load check; a large store read at random wants more
    reader_memory_mb: int = Field(READER_MEMORY_MB, ge=1, description="memory for shard files kept open "
                                  "for reads (~0.6 MB each, at most half the file descriptors); more "
                                  "makes random reads over a large store faster (default 32)")
    probe_processes: int = Field(1, ge=1, description="processes that run probe, head and regimes jobs")
    # what one probe, head or regimes job may hold (app/api/probe_jobs/memory_cost.py): a request whose
    # estimate exceeds it is a 413, and each probe process runs under an address-space limit of
    # this plus PROBE_PROCESS_OVERHEAD_MB (imports, allocator slack)
    probe_memory_mb: int = Field(8192, ge=64, description="memory one probe, head or regimes job may "
                                 "use; a request estimated over it is refused (413) and a probe "
                                 "process that grows past it fails its job")

    # jobs
    backend: Literal["embedded", "ray"] = Field("embedded", description="run extraction here (embedded) "
                                                "or on a Ray cluster (ray)")
    ray_address: str | None = Field(None, description="Ray cluster address: auto, host:port, or local")
    ray_actors: int = Field(1, ge=1, description="encoder actors on Ray (one GPU each)")
    lease_seconds: float = Field(30.0, gt=0, description="job lease; a job whose worker stops renewing it "
                                 "runs again (default 30)")
    heartbeat_seconds: float = Field(5.0, gt=0, description="lease renewal and worker liveness interval "
                                     "(default 5)")
    max_attempts: int = Field(3, ge=1, description="times a job is tried before it fails (default 3)")
    # a PostgreSQL server that stops answering must not hold a request forever (cache/postgres.py)
    catalog_statement_timeout_s: float = Field(120.0, ge=0, description="seconds a PostgreSQL catalog "
                                               "statement may run before the server cancels it (0: no limit)")

    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ... (default INFO)")

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
    def _default_model_first(self) -> Settings:
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
    def _default_pooling_is_stored(self) -> Settings:
        if self.default_pooling not in self.pooling_names:
            raise ValueError(f"default_pooling {self.default_pooling!r} is not among the poolings "
                             f"stored ({self.poolings})")
        return self

    @property
    def pooling_names(self) -> tuple[str, ...]:
        return parse_poolings(self.poolings)

    def extraction_options(self) -> ExtractionOptions:
        """What the encoder needs to reproduce the same keys (and the poolings it stores)."""
        return {"device": self.device, "precision": self.precision, "max_length": self.max_length,
                "storage_dtype": self.storage_dtype, "poolings": self.poolings, "engine": self.engine}


class ExtractionOptions(TypedDict):
    """``Settings.extraction_options()``: typed, so that ``**`` of it checks against
    ``Encoder.load`` and ``LocalExtractor.open``."""

    device: str
    precision: PrecisionChoice
    max_length: int | None
    storage_dtype: Literal["float16", "float32", "int8"]
    poolings: str
    engine: Literal["auto", "torch", "onnx"]


def env_name(name: str) -> str:
    """The environment twin of a setting or an option: ``data_dir`` and ``--data-dir``
    are both ``LAYERBANK_DATA_DIR``."""
    return ENV_PREFIX + name.lstrip("-").replace("-", "_").upper()


def environment_value(name: str) -> str | None:
    """The raw value of ``name``'s twin (``env_name``), None when unset or empty."""
    raw = os.environ.get(env_name(name))
    return raw if raw else None


def setting(name: str) -> Any:
    """One setting, validated as Settings validates it, from its twin, else its declared
    default: for a module that needs one value and must not fail on another's (the
    PostgreSQL catalog's statement timeout)."""
    field = Settings.model_fields[name]
    raw = environment_value(name)
    if raw is None:
        return field.default
    # the field's type with its constraints (ge=0 ...); built at run time, which mypy cannot follow
    kind: Any = Annotated[field.annotation, *field.metadata]
    try:
        return TypeAdapter(kind).validate_python(raw)
    except ValidationError as e:  # name the variable and the setting, not pydantic's type
        why = "; ".join(err["msg"] for err in e.errors())
        raise ValueError(f"{env_name(name)}={raw!r} is not a valid {name}: {why}") from None


def settings_env(settings: Settings) -> dict[str, str]:
    """The process environment with ``settings`` as its ``LAYERBANK_*`` variables
    (the API key stays out: the worker does not need it), for a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    for name, value in settings.model_dump().items():
        if value is None or name == "api_key":
            continue
        if isinstance(value, list):
            value = ",".join(map(str, value))
        elif isinstance(value, bool):
            value = "true" if value else "false"
        env[env_name(name)] = str(value)
    return env
