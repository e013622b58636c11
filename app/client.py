"""The Python client of a layerbank server: everything the HTTP API does, as
numpy arrays and plain dicts (httpx and numpy only).

Example::

    import layerbank

    lb = layerbank.Client("http://127.0.0.1:8000")        # api_key="..." if the server has one
    X = lb.features(["a great film", "a dull play"])      # [2, 384] float32, the default view
    ds = lb.upload_dataset("reviews", df, text_column="review", label_column="stars")
    result = lb.probe(ds, views=["each_layer"], poolings=["mean"])   # waits, with a progress bar
    head = lb.head(probe=result)                          # the probe's best view, kept
    lb.predict(head, ["a gripping story"])["labels"]

Inputs: ``upload_dataset`` takes a list of texts, a pandas DataFrame, a
pyarrow Table, a Hugging Face ``datasets.Dataset`` (columns by name), or a
path: .txt/.tsv/.csv/.jsonl files are uploaded as they are; a .parquet file
or a ``save_to_disk`` directory is read here (layerbank.app.tables) and sent
as texts. pandas, pyarrow and datasets are imported only when given.

Errors: every failure raises ``ApiError`` (``JobFailed`` for a job that failed
or was cancelled, ``JobTimeout`` for a wait that ran out, both subclasses), and
its ``str()`` carries the server's ``error`` text. Answers 429 (overloaded)
and 503 (not ready) are retried, waiting what ``Retry-After`` says, at most
``max_retries`` times and ``max_retry_seconds`` in all; past that bound the
server's answer is raised.
"""

from __future__ import annotations

import base64
import email.utils
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

__all__ = ["ApiError", "Client", "JobFailed", "JobTimeout"]

RETRY_STATUSES = (429, 503)
_TERMINAL = ("succeeded", "failed", "cancelled")
_UPLOAD_SUFFIXES = (".txt", ".tsv", ".csv", ".jsonl", ".conll")  # the server parses these itself


class ApiError(Exception):
    """A request that did not succeed: ``status`` (HTTP; None when no answer came),
    ``type`` (the server's, e.g. "validation"), ``message`` (the server's ``error``
    text) and ``body`` (the decoded answer)."""

    def __init__(self, status: int | None, type_: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {type_}: {message}" if status is not None else f"{type_}: {message}")
        self.status = status
        self.type = type_
        self.message = message
        self.body = body


class JobFailed(ApiError):
    """A job that ended ``failed`` or ``cancelled``; ``job`` is its last state."""

    def __init__(self, job: dict[str, Any]) -> None:
        error = job.get("error") or ""
        super().__init__(None, f"job_{job['state']}", error or f"job {job['id']} {job['state']}", job)
        self.args = (f"job {job['id']} {job['state']}: {error}".rstrip(": "),)
        self.job = job


class JobTimeout(ApiError, TimeoutError):
    """``wait`` gave up before the job finished (the job itself goes on)."""

    def __init__(self, job: dict[str, Any], timeout: float) -> None:
        super().__init__(None, "timeout", f"job {job['id']} still {job['state']} after {timeout} s", job)
        self.job = job


def _error_from(r: httpx.Response) -> ApiError:
    try:
        body = r.json()
    except ValueError:
        return ApiError(r.status_code, "error", r.text or r.reason_phrase)
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):  # /v1/embeddings answers in OpenAI's shape
        return ApiError(r.status_code, str(err.get("code") or err.get("type") or "error"),
                        str(err.get("message", r.text)), body)
    if isinstance(body, dict) and err is not None:
        return ApiError(r.status_code, str(body.get("type", "error")), str(err), body)
    return ApiError(r.status_code, "error", r.text, body)


def _retry_after(r: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    value = r.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _id(obj: str | dict[str, Any], *keys: str) -> str:
    """An id given as itself or inside a dict answered by the server (first of ``keys`` present)."""
    if isinstance(obj, str):
        return obj
    for k in keys:
        if obj.get(k):
            return str(obj[k])
    raise ValueError(f"no {' or '.join(keys)} in {sorted(obj)}")


def _job_id(job: str | dict[str, Any]) -> str:
    # a dataset or head carries its job as job_id; a job (or probe) is its own id
    return _id(job, "job_id", "id")


class Client:
    """A layerbank server at ``url``. ``max_retries`` / ``max_retry_seconds`` bound the
    retries of 429 and 503 answers; ``timeout`` is per HTTP request."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 600.0,
                 max_retries: int = 5, max_retry_seconds: float = 120.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        # no Origin header: the client is no browser, and a keyless server lets such clients
        # through (app/api/origin.py); an Origin would be refused behind a proxy that rewrites Host
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self.max_retries = max_retries
        self.max_retry_seconds = max_retry_seconds
        self.retries: list[tuple[int, float]] = []  # (status, seconds waited) of every retry, for a look
        self._sleep: Callable[[float], None] = time.sleep
        self._limits: dict[str, Any] | None = None

    # -- plumbing -----------------------------------------------------------
    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One call, retried on 429/503 within the bounds; ApiError on any other error status."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                r = self.http.request(method, path, **kw)
            except httpx.TransportError as e:
                raise ApiError(None, "unreachable", f"{method} {self.url}{path}: {e}") from e
            if r.status_code < 400:
                return r
            if r.status_code in RETRY_STATUSES and attempt < self.max_retries:
                # no Retry-After: back off 0.5, 1, 2, ... s
                delay = _retry_after(r)
                delay = min(0.5 * 2 ** attempt, 10.0) if delay is None else delay
                if time.monotonic() - started + delay <= self.max_retry_seconds:
                    self.retries.append((r.status_code, delay))
                    self._sleep(delay)
                    attempt += 1
                    continue
            raise _error_from(r)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """Any route: the decoded JSON answer (ApiError on an error status, after retries)."""
        return self._send(method, path, **kw).json()

    # -- features -------------------------------------------------------------
    def _max_texts(self) -> int:
        if self._limits is None:
            self._limits = self.info().get("limits") or {}
        return int(self._limits.get("max_texts_per_request") or 2048)

    def features(self, texts: Sequence[str], view: str | None = None, pooling: str | None = None,
                 *, model: str | None = None, precision: str | None = None,
                 return_info: bool = False) -> Any:
        """The features of ``texts`` in input order: [n, dim] (or [n, H, d] for
        all_layers), float32. More texts than the server takes per request are sent
        in several requests. ``precision``: fp32, bf16, ... (None: as served).
        ``return_info=True`` also returns the answers without their vectors
        (model, precision, view, usage, and per-text cached/n_tokens)."""
        texts = _text_list(texts)
        step = self._max_texts() if len(texts) > 64 else max(1, len(texts))
        parts, infos = [], []
        for start in range(0, max(len(texts), 1), step):
            x, info = self._features_once(texts[start:start + step], view, pooling, model, precision)
            parts.append(x)
            infos.append(info)
        x = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if not return_info:
            return x
        info = infos[0]
        if len(infos) > 1:
            info["data"] = [dict(d, index=i) for i, d in enumerate(d for inf in infos for d in inf["data"])]
            info["usage"] = {k: sum(inf["usage"][k] for inf in infos) for k in info["usage"]}
        return x, info

    def _features_once(self, texts: list[str], view: str | None, pooling: str | None,
                       model: str | None, precision: str | None) -> tuple[np.ndarray, dict[str, Any]]:
        body: dict[str, Any] = {"texts": texts, "format": "base64"}
        for k, v in (("view", view), ("pooling", pooling), ("model", model), ("precision", precision)):
            if v is not None:
                body[k] = v
        out = self.request("POST", "/v1/features", json=body)
        dtype = np.dtype("<f2" if out["dtype"] == "float16" else "<f4")
        shape = tuple(out["shape"])
        x = np.empty((len(out["data"]),) + shape, dtype=np.float32)
        for item in out["data"]:
            x[item["index"]] = np.frombuffer(base64.b64decode(item.pop("embedding")),
                                             dtype=dtype).reshape(shape)
        return x, out

    def embeddings(self, input: str | Sequence[str], *, model: str | None = None,
                   view: str | None = None, pooling: str | None = None, precision: str | None = None,
                   dimensions: int | None = None, normalize: bool | None = None,
                   return_info: bool = False) -> Any:
        """``POST /v1/embeddings`` (the OpenAI-compatible route): [n, dim] float32, the model's
        sentence-transformers recipe unless ``view``/``pooling``/``normalize`` say otherwise.
        ``return_info=True`` also returns the answer without its vectors (model, usage)."""
        texts = [input] if isinstance(input, str) else _text_list(input)
        body: dict[str, Any] = {"input": texts, "encoding_format": "base64"}
        for k, v in (("model", model), ("view", view), ("pooling", pooling), ("precision", precision),
                     ("dimensions", dimensions), ("normalize", normalize)):
            if v is not None:
                body[k] = v
        out = self.request("POST", "/v1/embeddings", json=body)
        rows = sorted(out["data"], key=lambda d: d["index"])
        x = np.stack([np.frombuffer(base64.b64decode(d.pop("embedding")), dtype="<f4") for d in rows])
        return (x, out) if return_info else x

    # -- datasets -------------------------------------------------------------
    def upload_dataset(self, name: str | None = None, texts: Any = None, *,
                       labels: Sequence[Any] | None = None, path: str | os.PathLike[str] | None = None,
                       text_column: str | None = None, label_column: str | None = None,
                       format: str | None = None, no_header: bool = False,
                       words: Sequence[Sequence[str]] | None = None,
                       tags: Sequence[Sequence[str]] | None = None,
                       precision: str | None = None, wait: bool = False,
                       progress: bool = False, model: str | None = None) -> dict[str, Any]:
        """Register a dataset; returns it (``id``, ``job_id``, ...). ``texts`` is a list
        of strings, a pandas DataFrame, a pyarrow Table, a ``datasets.Dataset`` (with
        ``text_column``/``label_column``) or a path (as ``path=``). Extraction runs in
        the background: ``wait=True`` (or ``wait(dataset)``) blocks until it succeeded.
        ``model``: which served model extracts it (None: the server's default)."""
        from layerbank.app.tables import InputError, is_table, table_texts

        if isinstance(texts, (str, os.PathLike)) and path is None:
            path, texts = texts, None
        if path is not None:
            try:
                ds = self._upload_path(Path(path), name, text_column, label_column, format, no_header,
                                       precision, model)
            except (InputError, OSError) as e:  # read here, so the same one error type
                raise ApiError(None, "validation", str(e)) from e
        else:
            body: dict[str, Any] = {"name": name or "dataset"}
            rows: list[int] | None = None
            if words is not None:
                body["words"] = [list(w) for w in words]
                if tags is not None:
                    body["tags"] = [list(t) for t in tags]
            elif is_table(texts):
                try:
                    table = table_texts(texts, text_column=text_column, label_column=label_column)
                except InputError as e:
                    raise ApiError(None, "validation", str(e)) from e
                body["texts"] = table.texts
                if labels is None and table.labels is not None:
                    labels, rows = table.labels, table.lines  # a bad label is named by its table row
            else:
                body["texts"] = _text_list(texts if texts is not None else [])
            if labels is not None:
                body["labels"] = _labels(labels, rows)  # ApiError for a NaN/NA label: nothing is sent
            if precision is not None:
                body["precision"] = precision
            if model is not None:
                body["model"] = model
            ds = self.request("POST", "/v1/datasets", json=body)
        if wait:
            self.wait(ds, progress=progress)
            ds = self.dataset(ds["id"])
        return ds

    def _upload_path(self, p: Path, name: str | None, text_column: str | None,
                     label_column: str | None, format: str | None, no_header: bool,
                     precision: str | None, model: str | None = None) -> dict[str, Any]:
        from layerbank.app.tables import is_table_path, read_table_path

        if format is None and is_table_path(p) or format == "parquet":
            # the server reads text formats only: read the table here, send its texts
            table = read_table_path(p, text_column=text_column, label_column=label_column)
            return self.upload_dataset(name or p.stem, table.texts, labels=table.labels,
                                       precision=precision, model=model)
        data: dict[str, str] = {k: v for k, v in (
            ("name", name), ("text_column", text_column), ("label_column", label_column),
            ("format", format), ("precision", precision), ("model", model)) if v is not None}
        if no_header:
            data["no_header"] = "true"
        content = p.read_bytes()  # bytes, not a handle: a retried upload sends them again
        return self.request("POST", "/v1/datasets", data=data,
                            files={"file": (p.name, content)})

    def datasets(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/datasets")["data"]

    def dataset(self, dataset: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", f"/v1/datasets/{_id(dataset, 'id')}")

    def delete_dataset(self, dataset: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/datasets/{_id(dataset, 'id')}")

    def dataset_features(self, dataset: str | dict[str, Any], view: str | None = None,
                         pooling: str | None = None) -> np.ndarray:
        """The dataset's matrix (rows in dataset order), read from the .npy stream."""
        params = {k: v for k, v in (("view", view), ("pooling", pooling)) if v is not None}
        r = self._send("GET", f"/v1/datasets/{_id(dataset, 'id')}/features", params=params)
        return np.load(io.BytesIO(r.content), allow_pickle=False)

    # -- probes and heads -------------------------------------------------------
    def submit_probe(self, dataset: str | dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
        """Queue a probe (``POST /v1/probes``; options as docs/probes.md); the probe, not waited for."""
        body = dict(options)
        if dataset is not None:
            body["dataset"] = _id(dataset, "id")
        return self._after_job("POST", "/v1/probes", json=body)

    def probe(self, dataset: str | dict[str, Any] | None = None, *, progress: bool = True,
              timeout: float | None = None, **options: Any) -> dict[str, Any]:
        """Probe a labelled dataset (``views=``, ``poolings=``, ``head=``, ``cv=``, ...):
        waits for its extraction and for the probe (a progress bar unless
        ``progress=False``), and returns the probe's result, with ``probe_id`` added."""
        p = self.submit_probe(dataset, **options)
        job = self.wait(p, timeout=timeout, progress=progress, desc="probe")
        return {**job["result"], "probe_id": p["id"]}

    def probes(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/probes", params={"limit": limit})["data"]

    def get_probe(self, probe: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", f"/v1/probes/{_id(probe, 'probe_id', 'id')}")

    def probe_plot(self, probe: str | dict[str, Any], which: str = "plot") -> bytes:
        """A finished probe's PNG: ``which`` is "plot" or "learning_curve"."""
        return self._send("GET", f"/v1/probes/{_id(probe, 'probe_id', 'id')}/{which}.png").content

    def head(self, dataset: str | dict[str, Any] | None = None, *,
             probe: str | dict[str, Any] | None = None, view: str | None = None,
             pooling: str | None = None, head: str | None = None, seed: int | None = None,
             name: str | None = None, wait: bool = True, progress: bool = False,
             timeout: float | None = None) -> dict[str, Any]:
        """Fit and keep a head (``POST /v1/heads``) on a dataset, or on a probe's best
        view and pooling (``probe=`` its id or the result ``probe()`` returned).
        Returns the head once fitted (``wait=False``: as queued)."""
        body: dict[str, Any] = {k: v for k, v in (
            ("view", view), ("pooling", pooling), ("head", head), ("seed", seed), ("name", name))
            if v is not None}
        if dataset is not None:
            body["dataset"] = _id(dataset, "id")
        if probe is not None:
            body["probe"] = _id(probe, "probe_id", "id")
        rec = self._after_job("POST", "/v1/heads", json=body)
        if not wait:
            return rec
        self.wait(rec, timeout=timeout, progress=progress, desc="head")
        return self.get_head(rec)

    def heads(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/heads")["data"]

    def get_head(self, head: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", f"/v1/heads/{_id(head, 'id')}")

    def delete_head(self, head: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/heads/{_id(head, 'id')}")

    def predict(self, head: str | dict[str, Any], texts: Sequence[str]) -> dict[str, Any]:
        """Labels and class probabilities of ``texts``: ``labels`` (list), ``probabilities``
        ([n, n_classes] float64, columns in ``classes`` order), ``cached``, ``usage``."""
        out = self.request("POST", f"/v1/heads/{_id(head, 'id')}/predict", json={"texts": _text_list(texts)})
        rows = sorted(out.pop("data"), key=lambda d: d["index"])
        return {**out, "labels": [d["label"] for d in rows],
                "probabilities": np.array([d["probabilities"] for d in rows], dtype=np.float64),
                "cached": [d["cached"] for d in rows]}

    # -- regimes ----------------------------------------------------------------
    def submit_regimes(self, dataset: str | dict[str, Any], **options: Any) -> dict[str, Any]:
        """Queue a regimes comparison (``POST /v1/regimes``; options as docs/regimes.md)."""
        return self._after_job("POST", "/v1/regimes", json={**options, "dataset": _id(dataset, "id")})

    def regimes(self, dataset: str | dict[str, Any], *, progress: bool = True,
                timeout: float | None = None, **options: Any) -> dict[str, Any]:
        """Freeze or fine-tune (``regimes=``, ``seeds=``, ``max_epochs=``, ...): waits and
        returns the comparison's result, with ``regimes_id`` added."""
        job = self.submit_regimes(dataset, **options)
        done = self.wait(job, timeout=timeout, progress=progress, desc="regimes")
        return {**done["result"], "regimes_id": job["id"]}

    def get_regimes(self, regimes: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", f"/v1/regimes/{_id(regimes, 'regimes_id', 'id')}")

    def regimes_plot(self, regimes: str | dict[str, Any]) -> bytes:
        return self._send("GET", f"/v1/regimes/{_id(regimes, 'regimes_id', 'id')}/plot.png").content

    def _after_job(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """A submission that needs another job done first (a dataset's extraction, the
        probe a head takes its view from): on the server's 409 naming that job while
        it is queued or running, wait for it, then submit once more."""
        try:
            return self.request(method, path, **kw)
        except ApiError as e:
            body = e.body if isinstance(e.body, dict) else {}
            job_id = body.get("job_id")
            if e.status != 409 or not job_id or body.get("job_state") not in ("queued", "running"):
                raise  # a failed extraction: the server's message says to upload it again
        self.wait(job_id)
        return self.request(method, path, **kw)

    # -- jobs -------------------------------------------------------------------
    def jobs(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"state": state} if state else {})
        return self.request("GET", "/v1/jobs", params=params)["data"]

    def job(self, job: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{_job_id(job)}")

    def cancel(self, job: str | dict[str, Any]) -> dict[str, Any]:
        """Cancel a job (or a dataset's, probe's, head's or regimes' job): a queued one at
        once, a running one at its next step (``cancel_requested``)."""
        return self.request("DELETE", f"/v1/jobs/{_job_id(job)}")

    def wait(self, job: str | dict[str, Any], timeout: float | None = None, poll: float = 0.2,
             progress: bool = False, desc: str | None = None) -> dict[str, Any]:
        """Block until the job (an id, a job, a dataset, probe, head or regimes job)
        finishes; return it. ``progress=True`` shows a tqdm bar of its done/total.
        Raises JobFailed when it failed or was cancelled, JobTimeout after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        try:
            while True:
                j = self.job(job)
                if progress:
                    bar = _show(bar, j, desc or j.get("kind") or "job")
                if j["state"] == "succeeded":
                    return j
                if j["state"] in ("failed", "cancelled"):
                    raise JobFailed(j)
                if deadline is not None and time.monotonic() > deadline:
                    raise JobTimeout(j, timeout or 0.0)
                self._sleep(poll)
        finally:
            if bar is not None:
                bar.close()

    def events(self, job: str | dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(event, job)`` pairs from the job's server-sent events, until ``done``."""
        try:
            with self.http.stream("GET", f"/v1/jobs/{_job_id(job)}/events") as r:
                if r.status_code >= 400:
                    r.read()
                    raise _error_from(r)
                name = "message"
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        yield name, json.loads(line[5:])
                        if name == "done":
                            return
        except httpx.TransportError as e:
            raise ApiError(None, "unreachable", f"events of job {_job_id(job)}: {e}") from e

    # -- operations -------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return self.request("GET", "/info")

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def ready(self) -> bool:
        """Whether the server answers /ready with 200 (no retry: a 503 is an answer here)."""
        try:
            return self.http.get("/ready").status_code == 200
        except httpx.TransportError:
            return False

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        return self._send("GET", "/metrics").text

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text_list(texts: Any) -> list[str]:
    """A list of the texts; a lone string is refused (it would be read as its characters)."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: wrap it as [text]")
    return [str(t) if isinstance(t, np.str_) else t for t in texts]


def _plain(values: Sequence[Any]) -> list[Any]:
    """Labels as JSON values: numpy scalars (from arrays, pandas) become Python ones."""
    return [v.item() if isinstance(v, np.generic) else v for v in values]


def _missing(v: Any) -> bool:
    """NaN (float, numpy), pandas' NA and NaT: a missing cell, which is no class and no JSON."""
    if isinstance(v, float) and math.isnan(v):
        return True
    return type(v).__name__ in ("NAType", "NaTType")  # pandas' singletons, without importing pandas


def _labels(labels: Sequence[Any], rows: Sequence[int] | None = None) -> list[Any]:
    """The labels as JSON values, their types kept (ints stay ints: the server keeps them so);
    ApiError naming the first NaN/NA one (and its table row, 1-based, for a table: ``rows``).
    ``None`` is "no label" and is sent as null."""
    values = _plain(list(labels))
    for i, v in enumerate(values):
        if _missing(v):
            where = f"labels[{i}]" if rows is None else f"row {rows[i]} (labels[{i}])"
            raise ApiError(None, "validation", f"{where} is {v!r}, not a label (a missing value): "
                           "drop that row, fill it, or give None for a text without a label; "
                           "nothing was sent")
    return values


def _show(bar: Any, job: dict[str, Any], desc: str) -> Any:
    """Create or move the progress bar to the job's done/total."""
    prog = job.get("progress") or {}
    total, done = prog.get("total"), prog.get("done") or 0
    if bar is None:
        from tqdm.auto import tqdm  # only when a bar is asked for

        bar = tqdm(total=total, desc=desc, unit="step", leave=False)
    if total is not None and bar.total != total:
        bar.total = total
    bar.set_postfix_str(job["state"], refresh=False)
    bar.update(max(0, done - bar.n))
    return bar
