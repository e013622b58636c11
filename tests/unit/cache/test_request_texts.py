"""cache/request_texts.py: a big request's texts go to a file, named in a small job row."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from layerbank.cache.errors import InputError
from layerbank.cache.request_texts import INLINE_MAX_CHARS, discard, requests_dir, texts_of, to_payload


def test_small_requests_stay_inline_and_write_nothing(tmp_path: Path) -> None:
    texts = ["a", "b" * 1000]
    assert to_payload(tmp_path, "job1", texts) == {"texts": texts}
    assert not requests_dir(tmp_path).exists()
    assert texts_of(tmp_path, {"texts": texts}) == texts


def test_a_big_request_goes_to_a_file_and_comes_back_the_same(tmp_path: Path) -> None:
    texts = ["naïve café 😀 " * 9000, "x" * (INLINE_MAX_CHARS - 5), "", "tab\tand\nnewline"]
    payload = to_payload(tmp_path, "0123456789abcdef", texts)
    assert payload["texts_file"] == "0123456789abcdef.json"
    data = (requests_dir(tmp_path) / "0123456789abcdef.json").read_bytes()
    assert payload["texts_sha256"] == hashlib.sha256(data).hexdigest()  # checked when read
    assert len(json.dumps(payload)) < 200  # what the job row holds
    assert sorted(p.name for p in requests_dir(tmp_path).iterdir()) == ["0123456789abcdef.json"]  # no .tmp
    assert texts_of(tmp_path, payload) == texts
    discard(tmp_path, payload)
    assert list(requests_dir(tmp_path).iterdir()) == []
    discard(tmp_path, payload)  # twice is fine
    discard(tmp_path, {"texts": texts})  # inline: nothing to remove


def test_a_missing_file_or_a_path_in_the_payload_fails_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"requests/gone\.json is gone"):
        texts_of(tmp_path, {"texts_file": "gone.json"})
    (tmp_path / "secret.json").write_text('["not yours"]')
    with pytest.raises(InputError, match="bad texts_file"):
        texts_of(tmp_path, {"texts_file": "../secret.json"})
    discard(tmp_path, {"texts_file": "../secret.json"})
    assert (tmp_path / "secret.json").exists()


def test_a_damaged_file_fails_naming_it_and_can_be_sent_again(tmp_path: Path) -> None:
    from layerbank.cache.request_texts import DamagedRequestTexts

    texts = ["x" * (INLINE_MAX_CHARS + 1)]
    payload = to_payload(tmp_path, "job2", texts)
    path = requests_dir(tmp_path) / "job2.json"
    path.write_text(json.dumps(["other texts"]))  # valid JSON, not what was written
    with pytest.raises(DamagedRequestTexts, match=r"requests/job2\.json is damaged .*sha256"):
        texts_of(tmp_path, payload)
    bare = {"texts_file": "job2.json"}  # an older API's payload: no checksum, the schema still holds
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(DamagedRequestTexts, match=r"requests/job2\.json is damaged \(not UTF-8 JSON"):
        texts_of(tmp_path, bare)
    path.write_text('{"texts": 3}')
    with pytest.raises(DamagedRequestTexts, match="no list of texts"):
        texts_of(tmp_path, bare)
    assert DamagedRequestTexts.failure_type == "unavailable"  # the request is fine: 503, send again


def test_a_full_disk_leaves_no_half_file_and_reads_as_storage(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import errno

    from layerbank.cache import request_texts
    from layerbank.cache.errors import failure_type

    class Full:  # a file on a disk that fills after the first bytes
        def __init__(self, path, mode):  # type: ignore[no-untyped-def]
            self.f = open(path, mode)  # noqa: SIM115

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            self.f.close()

        def write(self, data):  # type: ignore[no-untyped-def]
            self.f.write(data[:6])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(request_texts, "open", Full, raising=False)
    with pytest.raises(OSError) as e:
        to_payload(tmp_path, "0123456789abcdef", ["x" * (INLINE_MAX_CHARS + 1)])
    assert failure_type(e.value) == "storage"  # the API answers 507 (app/api/errors.py)
    assert list(requests_dir(tmp_path).iterdir()) == []
