"""Request and response bodies of the HTTP API (pydantic), so that the OpenAPI
schema at ``/openapi.json`` says exactly what is accepted and returned.

Limits that are settings (texts per request, characters per text) are checked
by the routes, not here, so that going over one is a 413 naming the limit
rather than a 422.

Example::

    FeaturesRequest(texts=["a text"], view="layer:-2", pooling="mean")
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from layerbank.cache.keys import PrecisionChoice
from layerbank.cache.poolings import PoolingName
from layerbank.cache.views import NAMED_VIEWS, VIEW_GRAMMAR, ViewError, parse_view

__all__ = [
    "DatasetCreate",
    "DatasetDeleted",
    "DatasetList",
    "DatasetOut",
    "DatasetTexts",
    "DatasetWords",
    "EmbeddingItem",
    "EmbeddingsRequest",
    "EmbeddingsResponse",
    "EmbeddingsUsage",
    "ErrorResponse",
    "OpenAIError",
    "OpenAIErrorResponse",
    "FeatureItem",
    "FeaturesRequest",
    "FeaturesResponse",
    "FeaturesUsage",
    "Format",
    "HealthOut",
    "InfoOut",
    "JobList",
    "JobOut",
    "Pooling",
    "Precision",
    "Progress",
    "ReadyOut",
    "Text",
    "apply_limits",
    "error_responses",
    "view_pattern",
]

Pooling: TypeAlias = PoolingName  # the registry's names (cache/poolings.py); a server stores those its setting names
Format = Literal["json", "base64"]
Precision: TypeAlias = PrecisionChoice  # cache/keys.py
_PRECISION = ("compute precision for the misses, and so which stored rows answer (rows computed "
              "at another precision never do); default: the served precision in /info")
# the schema says what the routes enforce (with friendlier messages than a pattern error):
# a text holds at least one non-whitespace character; a word is one run of them
Text = Annotated[str, WithJsonSchema({"type": "string", "pattern": "\\S"})]
Word = Annotated[str, WithJsonSchema({"type": "string", "pattern": "^\\S+$"})]
Name = Annotated[str, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 200,
                                      "pattern": "^[^\\x00-\\x1f]+$"})]


class ErrorResponse(BaseModel):
    error: str = Field(description="what went wrong, for a person")
    type: str = Field(description="validation, not_found, too_large, overloaded, not_ready, ...")
    field: str | None = Field(None, description="the request field at fault (422)")
    limit: str | None = Field(None, description="the setting that was exceeded (413, 429)")


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries: these statuses answer with ErrorResponse."""
    return {code: {"model": ErrorResponse} for code in codes}


# -- features -----------------------------------------------------------------
class FeaturesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[Text] = Field(min_length=1, description="texts, hashed exactly as given")
    view: str | None = Field(None, description=f"{VIEW_GRAMMAR}; default in /info")
    pooling: Pooling | None = Field(None, description="default in /info")
    model: str | None = Field(None, description="a served model's name or fingerprint (GET /info lists them); default: the default model")
    precision: Precision | None = Field(None, description=_PRECISION)
    format: Format = Field("json", description="json: lists of numbers; base64: little-endian "
                           "bytes of `dtype`")
    dtype: Literal["float16", "float32"] | None = Field(
        None, description="base64 element type; default: the storage dtype when the view is a "
        "plain copy of stored rows (layer:K, layers:..., all_layers), else float32")


class FeatureItem(BaseModel):
    index: int
    embedding: list[float] | list[list[float]] | str = Field(
        description="[dim], or [H][d] for all_layers; a base64 string with format=base64")
    cached: bool = Field(description="true when the row was already stored")
    n_tokens: int
    truncated: bool


class FeaturesUsage(BaseModel):
    texts: int
    cache_hits: int
    tokens_computed: int


class FeaturesResponse(BaseModel):
    model: str
    precision: str = Field(description="the precision the rows were computed at (fp32, bf16, fp16)")
    view: str
    pooling: str
    dim: int = Field(description="length of one vector (hidden size for all_layers)")
    shape: list[int] = Field(description="shape of one text's embedding: [dim] or [H, d]")
    format: Format
    dtype: str = Field(description="element type of base64 data; float32 for json")
    data: list[FeatureItem]
    usage: FeaturesUsage


# -- OpenAI-compatible embeddings --------------------------------------------
_EMBEDDING_DEFAULT = ("layerbank extension; default: the model's sentence-transformers recipe where it "
                      "ships one, else the server's default (GET /info, models[].embeddings)")
TOKEN_IDS_REFUSED = ("token ids are not accepted: layerbank stores features by text, so send the texts "
                     "themselves (LangChain's OpenAIEmbeddings sends token ids unless created with "
                     "check_embedding_ctx_length=False)")


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: Text | Annotated[list[Text], Field(min_length=1)] = Field(description="a text or a list of texts")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="must equal the view's width when given")
    user: str | None = None
    view: str | None = Field(None, description=_EMBEDDING_DEFAULT)
    pooling: Pooling | None = Field(None, description=_EMBEDDING_DEFAULT)
    normalize: bool | None = Field(None, description="layerbank extension: L2-normalise each vector; "
                                   + _EMBEDDING_DEFAULT.removeprefix("layerbank extension; "))
    precision: Precision | None = Field(None, description="layerbank extension; " + _PRECISION)

    @field_validator("input", mode="before")
    @classmethod
    def _no_token_ids(cls, value: Any) -> Any:
        # what LangChain's OpenAIEmbeddings sends by default: say why and what to set, not
        # pydantic's "Input should be a valid string (and 1 more problem)"
        if isinstance(value, list) and any(
                isinstance(v, list) or (isinstance(v, int) and not isinstance(v, bool)) for v in value):
            raise ValueError(TOKEN_IDS_REFUSED)
        return value


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingsUsage


class OpenAIError(BaseModel):
    message: str = Field(description="what went wrong, for a person (the OpenAI SDK shows it)")
    type: str = Field(description="invalid_request_error, authentication_error, rate_limit_error, "
                      "server_error")
    param: str | None = Field(None, description="the request field at fault")
    code: str | None = Field(None, description="layerbank's own type: validation, too_large, ...")


class OpenAIErrorResponse(BaseModel):
    """/v1/embeddings errors come in OpenAI's shape (app/api/errors.py)."""

    error: OpenAIError


# -- datasets -----------------------------------------------------------------
_DATASET_MODEL = ("which served model extracts it (a name or fingerprint /info lists); default: the "
                  "default model. Its probes and heads use that model's features")
Label = str | int | float | bool | None


class DatasetTexts(BaseModel):
    """A sentence task: texts, optionally one label each."""

    model_config = ConfigDict(extra="forbid")
    name: Name = Field(min_length=1, max_length=200)
    texts: list[Text] = Field(min_length=1, description="the items' texts")
    labels: list[Label] | None = Field(None, description="one per text, stored as text")
    precision: Precision | None = Field(None, description=_PRECISION)
    model: str | None = Field(None, description=_DATASET_MODEL)


class DatasetWords(BaseModel):
    """A token task: each item's words (the text is the words joined by single spaces)."""

    model_config = ConfigDict(extra="forbid")
    name: Name = Field(min_length=1, max_length=200)
    words: list[Annotated[list[Word], Field(min_length=1)]] = Field(min_length=1)
    tags: list[list[str]] | None = Field(None, description="one tag per word")
    labels: list[Label] | None = Field(None, description="one per item, stored as text")
    precision: Precision | None = Field(None, description=_PRECISION)
    model: str | None = Field(None, description=_DATASET_MODEL)


DatasetCreate = DatasetTexts | DatasetWords


class DatasetOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    name: str
    task: str
    n_items: int
    model: str
    job_id: str | None
    created: float
    job: dict[str, Any] | None = None


class DatasetList(BaseModel):
    data: list[DatasetOut]


class DatasetDeleted(BaseModel):
    id: str
    deleted: bool


# -- jobs ---------------------------------------------------------------------
class Progress(BaseModel):
    model_config = ConfigDict(extra="allow")
    done: int | None = None
    total: int | None = None
    tokens: int | None = None
    tokens_per_second: float | None = None
    eta_seconds: float | None = None


class JobOut(BaseModel):
    id: str
    kind: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    attempts: int
    progress: Progress
    error: str | None
    # why it failed, for programs: input, storage (disk full), worker_died, unavailable (the
    # catalog could not be reached), internal (cache/errors.py)
    error_type: Literal["input", "storage", "worker_died", "unavailable", "internal"] | None = None
    cancel_requested: bool
    created: float
    started: float | None
    finished: float | None
    result: Any = None


class JobList(BaseModel):
    data: list[JobOut]


# -- operations -----------------------------------------------------------------
class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    ready: bool
    checks: dict[str, bool]
    workers: list[dict[str, Any]]


class InfoOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: str
    ready: bool
    model: dict[str, Any] | None
    layers: int | None = Field(description="transformer layers L (hidden states h_0..h_L)")
    n_hidden_states: int | None
    hidden_size: int | None
    dtype: str = Field(description="storage dtype of cached vectors")
    precision: str | None = Field(description="compute precision of the encoder")
    poolings: list[str]
    views: list[str]
    heads: list[str] = Field(description="the heads a probe can fit (POST /v1/probes `head`)")
    defaults: dict[str, str]
    limits: dict[str, int | float]


_NUM = r"-?(?:\d{1,15}(?:\.\d{0,15})?|\.\d{1,15})(?:[eE][-+]?\d{1,2})?"


def view_pattern(n_states: int | None, *, all_layers: bool = True) -> str:
    """A regular expression for the views a model with ``n_states`` hidden states
    accepts (any layer number when unknown); the API holds views to it exactly."""
    if n_states is None:
        idx, weights = r"-?\d{1,6}", f"{_NUM}(?:,{_NUM})*"
    else:
        idx = "(?:" + "|".join(str(i) for i in range(-n_states, n_states)) + ")"
        weights = f"{_NUM}(?:,{_NUM}){{{n_states - 1}}}"
    named = [v for v in NAMED_VIEWS if (all_layers or v != "all_layers") and _fits(v, n_states)]
    return f"^(?:layer:{idx}|layers:{idx}(?:,{idx})*|{'|'.join(named)}|weighted:{weights})$"


def _fits(named_view: str, n_states: int | None) -> bool:
    """Whether a model with ``n_states`` hidden states (None: any) has the layers the view reads."""
    if n_states is None:
        return True
    try:
        parse_view(named_view).needed_layers(n_states)
    except ViewError:  # concat_last_4 on a model with fewer than 4 hidden states
        return False
    return True


def apply_limits(schema: dict[str, Any], *, max_texts: int, max_chars: int, max_dataset_texts: int,
                 n_states: int | None = None, model_names: list[str] | None = None) -> None:
    """Write this server's limits, view grammar and model names into its OpenAPI
    schema (in place), so that a schema-valid request is not refused for them.

    What no schema can say stays a 422: labels of another length than texts,
    file contents that do not parse, ``dimensions`` other than the view's width.
    """
    fields = {"FeaturesRequest": ("texts", max_texts), "EmbeddingsRequest": ("input", max_texts),
              "DatasetTexts": ("texts", max_dataset_texts)}
    pattern = view_pattern(n_states)

    def limit(prop: dict[str, Any], n: int) -> None:
        if prop.get("type") == "array":
            prop["maxItems"] = n
            prop.setdefault("items", {})["maxLength"] = max_chars
        elif prop.get("type") == "string":
            prop["maxLength"] = max_chars
        for sub in prop.get("anyOf", []):
            limit(sub, n)

    def strings(prop: dict[str, Any]) -> list[dict[str, Any]]:
        return [p for p in [prop, *prop.get("anyOf", [])] if p.get("type") == "string"]

    def walk(node: Any) -> None:  # models appear in components and inline in request bodies
        if isinstance(node, dict):
            props = node.get("properties", {})
            field = fields.get(node.get("title", ""))
            if field is not None and field[0] in props:
                limit(props[field[0]], field[1])
            if node.get("title") in ("FeaturesRequest", "EmbeddingsRequest"):
                for p in strings(props.get("view", {})):
                    p["pattern"] = pattern if node["title"] == "FeaturesRequest" else \
                        view_pattern(n_states, all_layers=False)
                for p in strings(props.get("model", {})):
                    if model_names:
                        p["enum"] = model_names
            if node.get("in") == "query" and node.get("name") == "view":
                for p in strings(node.get("schema", {})):
                    p["pattern"] = "^$|" + pattern  # "?view=" is the default view
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
