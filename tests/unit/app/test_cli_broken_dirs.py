"""Issue 25, rows 11 and 12, on the command line:

- a Hugging Face ``save_to_disk`` directory that cannot be read (its ``.arrow``
  missing or garbage, ``state.json`` garbage) is one line naming it, exit 2,
  not a traceback;
- ``layerbank repair`` on a replicas' directory (the PostgreSQL marker
  ``catalog.postgresql``) without ``--catalog-url`` refuses, naming it, and
  ``--force`` writes no ``catalog.sqlite`` beside the running replicas.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layerbank.app.cli.main import main


@pytest.fixture(scope="module")
def broken_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import datasets

    root = tmp_path_factory.mktemp("hf")
    ds = datasets.Dataset.from_dict({"text": ["a good film", "a bad film"], "label": [1, 0]})
    out = {}
    for name in ("missing_arrow", "garbage_arrow", "garbage_state"):
        ds.save_to_disk(str(root / name))
        out[name] = root / name
    next(out["missing_arrow"].glob("*.arrow")).unlink()
    next(out["garbage_arrow"].glob("*.arrow")).write_bytes(b"\x00garbage" * 100)
    (out["garbage_state"] / "state.json").write_text("{not json")
    return out


@pytest.mark.parametrize("name", ["missing_arrow", "garbage_arrow", "garbage_state"])
def test_an_unreadable_saved_dataset_is_one_line(broken_datasets: dict[str, Path], name: str,
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERBANK_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(SystemExit) as done:
        main(["extract", str(broken_datasets[name]), "--text-column", "text"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"layerbank: error: {broken_datasets[name]} is not a readable save_to_disk dataset")


def test_repair_refuses_a_replicas_directory_and_writes_no_sqlite_catalog(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAYERBANK_CATALOG_URL", raising=False)
    d = tmp_path / "shared"
    (d / "shards").mkdir(parents=True)
    (d / "catalog.postgresql").write_text("postgresql://lb@db/layerbank\n")
    for force in ([], ["--force"]):
        with pytest.raises(SystemExit) as done:
            main(["repair", "--data-dir", str(d), *force])
        err = capsys.readouterr().err
        assert done.value.code == 2, err
        assert "indexed by a PostgreSQL catalog (postgresql://lb@db/layerbank)" in err
        assert "--catalog-url" in err and "nothing to repair" not in err
        assert not (d / "catalog.sqlite").exists()
    assert sorted(p.name for p in d.iterdir()) == ["catalog.postgresql", "shards"]
