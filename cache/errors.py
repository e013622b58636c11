"""Base classes for the errors every layer raises, and the failure types a job row records.

The HTTP layer translates these once (``layerbank.app.api.errors`` registers a
handler on ``InputError``), so domain code raises ``InputError(msg, field=...)``
where it finds the problem and never re-raises it as an HTTP error itself.

A failed job stores one of ``FAILURE_TYPES`` in its ``error_type`` column
(``failure_type(exc)`` picks it), so the API answers 507 for a full disk or
422 for input that cannot run from that type, 503 for a catalog that could
not be reached meanwhile, never by reading the message.

Example::

    class WordSetError(InputError): ...
    raise WordSetError("tags.3 has 4 tags for 5 words", field="tags.3")
    failure_type(ShardWriteError(28, "no space"))   # "storage"
"""

from __future__ import annotations

__all__ = ["FAILURE_TYPES", "InputError", "failure_type"]

# What a job row's error_type may hold; the HTTP status for each is in app/api/errors.py.
FAILURE_TYPES = (
    "input",        # the job cannot run as submitted (a person changes the request)
    "storage",      # disk full, quota or file-size limit (an operator frees space; retry as is)
    "worker_died",  # its worker died max_attempts times while running it
    "unavailable",  # the catalog could not be reached while it ran (nothing to change; retry as is)
    "internal",     # a bug or an unexpected failure (the log has the traceback)
)


class InputError(ValueError):
    """Input that cannot be used as given; ``field`` names where (``"views"``, ``"tags.3"``).

    A ValueError, so code that caught ValueError before still does. The
    message is for a person and shown as it is.
    """

    failure_type = "input"
    default_field: str | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field if field is not None else self.default_field


def failure_type(exc: BaseException) -> str:
    """The failure type a job that raised ``exc`` records (see ``FAILURE_TYPES``).

    An exception class says its own type with a ``failure_type`` class
    attribute; a disk that is full is recognised by its class (``ShardWriteError``
    lives in cache/space.py and says "storage"); anything else is "internal".
    """
    t = getattr(exc, "failure_type", None)
    if t in FAILURE_TYPES:
        return t
    from .space import is_disk_full  # a full disk met outside a shard write (the catalog, a head's files)

    return "storage" if is_disk_full(exc) else "internal"
