"""Jobs: state, progress, cancellation, and progress as server-sent events.

- ``GET /v1/jobs/{id}``: ``state`` (queued, running, succeeded, failed,
  cancelled), ``progress`` (done, total, tokens_per_second, eta_seconds),
  ``error``, ``result`` (the extraction summary once it succeeded).
- ``DELETE /v1/jobs/{id}``: a queued job is cancelled at once (200); a
  running one stops at its next batch (202, ``cancel_requested``); a finished
  one is a 409.
- ``GET /v1/jobs/{id}/events``: ``text/event-stream``. One ``progress`` event
  now and one whenever the job row changes, then one ``done`` event with the
  final job and the stream ends. Every event's ``data`` is the job as JSON.

Example::

    curl -N localhost:8000/v1/jobs/3f2a.../events
    event: progress
    data: {"id": "3f2a...", "state": "running", "progress": {"done": 512, "total": 2000, ...}}
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.errors import Conflict
from layerbank.app.api.route_helpers import find_job, job_out, json_response
from layerbank.app.api.schemas import JobList, JobOut, error_responses
from layerbank.cache.jobs import JOB_STATES

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["jobs"])
_ERRORS = error_responses(401, 404, 409, 422)
_TERMINAL = ("succeeded", "failed", "cancelled")
_EVENT_POLL_S = 0.2
_KEEPALIVE_S = 15.0


@router.get("/jobs", response_model=JobList, responses=_ERRORS, summary="Recent jobs, newest first")
async def list_jobs(state: AppState = Depends(get_state), limit: int = Query(100, ge=1, le=1000),
                    job_state: str | None = Query(None, alias="state", pattern="^(" +
                                                  "|".join(JOB_STATES) + ")$")) -> Response:
    jobs = [j for j in state.queue.list(limit=limit) if job_state in (None, j.state)]
    return json_response({"data": [job_out(j) for j in jobs]})


@router.get("/jobs/{job_id}", response_model=JobOut, responses=_ERRORS)
async def get_job(job_id: str, state: AppState = Depends(get_state)) -> Response:
    return json_response(job_out(find_job(state, job_id)))


@router.delete("/jobs/{job_id}", response_model=JobOut, responses={
    **_ERRORS, 202: {"model": JobOut, "description": "running: it stops at its next batch"}},
    summary="Cancel a job")
async def cancel_job(job_id: str, state: AppState = Depends(get_state)) -> Response:
    job = find_job(state, job_id)
    if job.state in _TERMINAL:
        raise Conflict(f"job {job_id} already {job.state}; nothing to cancel")
    job = state.queue.cancel(job_id) or job
    return json_response(job_out(job), status=200 if job.state == "cancelled" else 202)


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@router.get("/jobs/{job_id}/events", responses={
    **_ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "progress events"}},
    response_class=StreamingResponse, summary="Progress as server-sent events")
async def job_events(job_id: str, state: AppState = Depends(get_state)) -> StreamingResponse:
    find_job(state, job_id)

    async def events() -> AsyncIterator[bytes]:
        last: str | None = None
        quiet_since = time.monotonic()
        while True:
            job = state.queue.get(job_id)
            if job is None:  # deleted under us
                yield _event("done", {"id": job_id, "state": "cancelled", "error": "job removed"})
                return
            out = job_out(job)
            if job.state in _TERMINAL:
                yield _event("done", out)
                return
            text = json.dumps([out["state"], out["progress"], out["attempts"]])
            if text != last:
                last, quiet_since = text, time.monotonic()
                yield _event("progress", out)
            elif time.monotonic() - quiet_since > _KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield b": keep-alive\n\n"  # a comment: keeps proxies from closing the stream
            await asyncio.sleep(_EVENT_POLL_S)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
