"""A small Python client for a layerbank server (httpx and numpy only).

Example::

    from layerbank.app.client import Client

    lb = Client("http://127.0.0.1:8000")                  # api_key="..." if the server has one
    X = lb.features(["a great film", "a dull play"])      # [2, 384] float32, the default view
    A = lb.features(texts, view="all_layers")             # [n, H, d]

    ds = lb.upload_dataset("sst2-test", path="test.tsv", label_column="label")
    lb.wait(ds)                                           # the extraction job, to success
    X = lb.dataset_features(ds["id"], view="layer:-2")    # the whole matrix, from .npy

Errors from the server raise ``ApiError`` with its ``status``, ``type`` and
message; a job that fails or is cancelled raises ``JobFailed``.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

__all__ = ["ApiError", "Client", "JobFailed"]


class ApiError(Exception):
    """An error answer: ``status`` (HTTP), ``type`` (e.g. "validation") and the message."""

    def __init__(self, status: int, type_: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status = status
        self.type = type_
        self.message = message
        self.body = body


class JobFailed(Exception):
    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(f"job {job['id']} {job['state']}: {job.get('error') or ''}".rstrip(": "))
        self.job = job


class Client:
    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    # -- plumbing -----------------------------------------------------------
    def _check(self, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            try:
                body = r.json()
                raise ApiError(r.status_code, body.get("type", "error"), body.get("error", r.text), body)
            except (ValueError, AttributeError):
                raise ApiError(r.status_code, "error", r.text) from None
        return r

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """One call; the decoded JSON answer (ApiError on an error status)."""
        r = self._check(self.http.request(method, path, **kw))
        return r.json()

    # -- features -------------------------------------------------------------
    def features(self, texts: Sequence[str], view: str | None = None, pooling: str | None = None,
                 *, model: str | None = None, precision: str | None = None,
                 return_info: bool = False) -> Any:
        """The features of ``texts`` in input order: [n, dim] (or [n, H, d] for
        all_layers), float32. ``precision``: fp32, bf16, ... (None: as served).
        ``return_info=True`` also returns the response without its data
        (model, precision, view, usage, and per-text cached/n_tokens)."""
        body: dict[str, Any] = {"texts": list(texts), "format": "base64"}
        for k, v in (("view", view), ("pooling", pooling), ("model", model), ("precision", precision)):
            if v is not None:
                body[k] = v
        out = self.request("POST", "/v1/features", json=body)
        dtype = np.dtype("<f2" if out["dtype"] == "float16" else "<f4")
        shape = tuple(out["shape"])
        x = np.empty((len(out["data"]),) + shape, dtype=np.float32)
        for item in out["data"]:
            x[item["index"]] = np.frombuffer(base64.b64decode(item["embedding"]), dtype=dtype).reshape(shape)
        if return_info:
            for item in out["data"]:
                item.pop("embedding")
            return x, out
        return x

    # -- datasets -------------------------------------------------------------
    def upload_dataset(self, name: str | None = None, texts: Sequence[str] | None = None, *,
                       labels: Sequence[Any] | None = None, path: str | Path | None = None,
                       text_column: str | None = None, label_column: str | None = None,
                       format: str | None = None, no_header: bool = False,
                       words: Sequence[Sequence[str]] | None = None,
                       tags: Sequence[Sequence[str]] | None = None,
                       precision: str | None = None) -> dict[str, Any]:
        """Register a dataset from texts (or words/tags), or upload a file; returns
        the dataset (``id``, ``job_id``, ...). Extraction runs in the background:
        ``wait(dataset)`` for it. ``precision``: the dataset's (None: as served)."""
        if path is not None:
            p = Path(path)
            data: dict[str, str] = {k: v for k, v in (
                ("name", name), ("text_column", text_column), ("label_column", label_column),
                ("format", format), ("precision", precision)) if v is not None}
            if no_header:
                data["no_header"] = "true"
            with open(p, "rb") as fh:
                return self.request("POST", "/v1/datasets", data=data,  # type: ignore[no-any-return]
                                    files={"file": (p.name, fh)})
        body: dict[str, Any] = {"name": name or "dataset"}
        if words is not None:
            body["words"] = [list(w) for w in words]
            if tags is not None:
                body["tags"] = [list(t) for t in tags]
        else:
            body["texts"] = list(texts or [])
        if labels is not None:
            body["labels"] = list(labels)
        if precision is not None:
            body["precision"] = precision
        return self.request("POST", "/v1/datasets", json=body)  # type: ignore[no-any-return]

    def datasets(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/datasets")["data"]  # type: ignore[no-any-return]

    def dataset(self, dataset_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/datasets/{dataset_id}")  # type: ignore[no-any-return]

    def delete_dataset(self, dataset_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/datasets/{dataset_id}")  # type: ignore[no-any-return]

    def dataset_features(self, dataset_id: str, view: str | None = None,
                         pooling: str | None = None) -> np.ndarray:
        """The dataset's matrix (rows in dataset order), read from the .npy stream."""
        params = {k: v for k, v in (("view", view), ("pooling", pooling)) if v is not None}
        r = self._check(self.http.get(f"/v1/datasets/{dataset_id}/features", params=params))
        return np.load(io.BytesIO(r.content), allow_pickle=False)  # type: ignore[no-any-return]

    # -- jobs -------------------------------------------------------------------
    def job(self, job: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{_job_id(job)}")  # type: ignore[no-any-return]

    def cancel(self, job: str | dict[str, Any]) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/jobs/{_job_id(job)}")  # type: ignore[no-any-return]

    def wait(self, job: str | dict[str, Any], timeout: float | None = None,
             poll: float = 0.2) -> dict[str, Any]:
        """Block until the job (an id, a job, or a dataset) finishes; return it.
        Raises JobFailed when it failed or was cancelled, TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            j = self.job(job)
            if j["state"] == "succeeded":
                return j
            if j["state"] in ("failed", "cancelled"):
                raise JobFailed(j)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {j['id']} still {j['state']} after {timeout} s")
            time.sleep(poll)

    def events(self, job: str | dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(event, job)`` pairs from the job's server-sent events, until ``done``."""
        with self.http.stream("GET", f"/v1/jobs/{_job_id(job)}/events") as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            name = "message"
            for line in r.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    yield name, json.loads(line[5:])
                    if name == "done":
                        return

    # -- operations -------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return self.request("GET", "/info")  # type: ignore[no-any-return]

    def ready(self) -> bool:
        return self.http.get("/ready").status_code == 200

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _job_id(job: str | dict[str, Any]) -> str:
    if isinstance(job, str):
        return job
    return str(job.get("job_id") or job["id"])
