"""layerbank.cache.errors: the failure type a job row records decides the HTTP status
it is answered with (507, 422 or 500), and InputError names the field a 422 points at.
The values are stored in the catalog and read back by the API, so they are checked
exactly (written for the mutants bench/mutation.sh found surviving in cache/errors.py)."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from layerbank.cache.errors import FAILURE_TYPES, InputError, failure_type
from layerbank.cache.space import ShardWriteError


def test_the_failure_types_are_the_stored_words() -> None:
    assert FAILURE_TYPES == ("input", "storage", "worker_died", "unavailable", "internal")


@pytest.mark.parametrize(("exc", "want"), [
    (InputError("tags.3 has 4 tags for 5 words", field="tags.3"), "input"),
    (ShardWriteError(errno.ENOSPC, "no space left on device while writing shard j-00000.h5"), "storage"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "storage"),
    (sqlite3.OperationalError("database or disk is full"), "storage"),
    (ValueError("a bug"), "internal"),
    (OSError(errno.EACCES, "Permission denied"), "internal"),
])
def test_failure_type_of_each_kind_of_error(exc: BaseException, want: str) -> None:
    assert failure_type(exc) == want


def test_a_failure_type_not_in_the_list_is_internal() -> None:
    class Odd(Exception):
        failure_type = "mystery"

    class Died(Exception):
        failure_type = "worker_died"

    assert failure_type(Odd()) == "internal"
    assert failure_type(Died()) == "worker_died"


def test_an_input_error_names_its_field_and_keeps_its_message() -> None:
    e = InputError("views: layer:99 is out of range", field="views")
    assert (str(e), e.field, e.failure_type) == ("views: layer:99 is out of range", "views", "input")
    assert isinstance(e, ValueError)  # code that caught ValueError still does
    assert InputError("no field").field is None


def test_a_subclass_default_field_is_used_unless_one_is_given() -> None:
    class WordSetError(InputError):
        default_field = "words"

    assert WordSetError("empty").field == "words"
    assert WordSetError("tags.3 is bad", field="tags.3").field == "tags.3"
    assert failure_type(WordSetError("empty")) == "input"
