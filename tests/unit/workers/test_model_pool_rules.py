"""workers/model_pool.py's rules on encoders that are not torch models (torch-free, under 1 s).

The mutation run (bench/mutation.sh) runs this file first for every mutant of
the pool; tests/unit/workers/test_model_pool.py and
tests/reliability/test_model_identity.py load real tiny models for the same
rules end to end. Here an "encoder" is what the pool reads of one: its
fingerprint, name, info, the sizes of its tensors and whether it has a
second engine; model directories are real folders of files, so
fingerprints and weight sizes come from the files as they do in a worker.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from layerbank.cache.errors import failure_type
from layerbank.cache.fingerprint import model_fingerprint
from layerbank.workers.model_pool import (
    ModelChanged,
    ModelPool,
    ServedModel,
    UnknownModel,
    default_budget_bytes,
    encoder_bytes,
)
from layerbank.workers.model_source import ModelSource, locate_model

MiB = 2**20


class Tensor:
    """What encoder_bytes reads of a tensor."""

    def __init__(self, numel: int, element_size: int = 4) -> None:
        self._n, self._size = numel, element_size

    def numel(self) -> int:
        return self._n

    def element_size(self) -> int:
        return self._size


class Weights:
    def __init__(self, params: list[Tensor], buffers: list[Tensor] = ()) -> None:  # type: ignore[assignment]
        self._p, self._b = params, list(buffers)

    def parameters(self) -> Any:
        return iter(self._p)

    def buffers(self) -> Any:
        return iter(self._b)


@dataclasses.dataclass
class Enc:
    fingerprint: str
    name: str
    info: dict[str, Any]
    model: Weights
    engine: Any = None


def model_dir(root: Path, name: str, weight_bytes: int, seed: int = 0, suffix: str = ".safetensors") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"num_hidden_layers": 2}')
    (d / f"model{suffix}").write_bytes(bytes([seed % 256]) * weight_bytes)
    return d


def enc_of(path: Path | str, size_bytes: int | None = None) -> Enc:
    """The encoder a load of ``path`` gives: its files' fingerprint, tensors of its weights' size."""
    p = os.fspath(path)
    size = size_bytes if size_bytes is not None else ServedModel(locate_model(p), p).file_bytes()
    return Enc(model_fingerprint(p), os.path.basename(p), {"name": os.path.basename(p), "path": p},
               Weights([Tensor(size // 4)]))


class Loader:
    """A pool's ``load``: counts its calls; ``fail`` makes the next loads raise."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: Exception | None = None

    def __call__(self, entry: ServedModel) -> Enc:
        self.calls.append(str(entry.spec))
        if self.fail is not None:
            raise self.fail
        return enc_of(str(entry.spec))


def pool_of(default: Path, others: list[Path], budget: int | None = None,
            load: Loader | None = None) -> tuple[ModelPool, list[str]]:
    registered: list[str] = []
    pool = ModelPool(enc_of(default), [ServedModel(locate_model(os.fspath(d)), os.fspath(d)) for d in others],
                     load=load if load is not None else Loader(), budget_bytes=budget,
                     on_load=lambda e: registered.append(e.fingerprint))
    return pool, registered


def rewrite(d: Path, seed: int) -> None:
    """Other weights of the same size, as an overwrite in place gives them (a new mtime too)."""
    w = next(p for p in d.iterdir() if p.name.startswith("model."))
    size = w.stat().st_size
    w.write_bytes(bytes([seed % 256]) * size)
    st = w.stat()
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


# -- what a model's weights take ---------------------------------------------------------------

def test_file_bytes_counts_one_weight_format_safetensors_first(tmp_path: Path) -> None:
    both = model_dir(tmp_path, "both", 1000)
    (both / "pytorch_model.bin").write_bytes(b"b" * 3000)  # a .bin copy beside: not loaded too
    (both / "tokenizer.json").write_bytes(b"t" * 5000)  # not a weight file
    bins = model_dir(tmp_path, "bins", 100, suffix=".bin")
    (bins / "pytorch_model-00002-of-00002.bin").write_bytes(b"b" * 200)  # shards add up
    pt = model_dir(tmp_path, "pt", 700, suffix=".pt")
    none = tmp_path / "none"
    none.mkdir()
    (none / "config.json").write_text("{}")
    sizes = {d.name: ServedModel(locate_model(os.fspath(d)), os.fspath(d)).file_bytes()
             for d in (both, bins, pt, none)}
    assert sizes == {"both": 1000, "bins": 300, "pt": 700, "none": 0}
    gone = ServedModel(locate_model(os.fspath(pt)), os.fspath(pt))
    for f in pt.iterdir():
        f.unlink()
    pt.rmdir()
    assert gone.file_bytes() == 0  # removed since it was located
    assert ServedModel(ModelSource("org/model", "org/model", None), "org/model").file_bytes() == 0  # not local


def test_encoder_bytes_counts_parameters_and_buffers_and_a_second_engine_twice() -> None:
    weights = Weights([Tensor(10), Tensor(5, 2)], [Tensor(3, 8)])
    enc = Enc("local:x", "x", {}, weights)
    assert encoder_bytes(enc) == 40 + 10 + 24
    assert encoder_bytes(dataclasses.replace(enc, engine=object())) == 2 * 74


def test_the_default_budget_on_a_cpu_is_half_the_machines_memory() -> None:
    with open("/proc/meminfo") as f:
        total_kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert default_budget_bytes("cpu") == total_kib * 1024 // 2


# -- which model a job names -------------------------------------------------------------------

def test_a_model_is_named_by_display_name_path_folder_or_fingerprint(tmp_path: Path) -> None:
    d = model_dir(tmp_path / "models", "encoder-X", 64)
    entry = ServedModel(locate_model(os.fspath(d) + "/"), os.fspath(d))
    # the display name is what the settings say; the path is the directory's own
    assert entry.names() == [os.fspath(d) + "/", os.fspath(d), "encoder-X", model_fingerprint(os.fspath(d))]
    same = ServedModel(locate_model(os.fspath(d)), os.fspath(d))
    assert same.names() == [os.fspath(d), "encoder-X", model_fingerprint(os.fspath(d))]  # display == path: once
    named = ServedModel(ModelSource(os.fspath(d), "tiny one", d), os.fspath(d))
    assert named.names() == ["tiny one", os.fspath(d), "encoder-X", model_fingerprint(os.fspath(d))]
    hub = ServedModel(ModelSource("org/m", "org/m", None), "org/m")
    assert hub.names() == ["org/m", "m", "hub:org/m@main"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.spec = "other"  # type: ignore[misc]


def test_the_default_answers_to_none_its_fingerprint_and_its_names(tmp_path: Path) -> None:
    default = model_dir(tmp_path, "default", 64)
    pool, _ = pool_of(default, [])
    enc = pool.default
    enc.name = "the-default"  # the encoder's own name and its info's name may differ
    for name in (None, enc.fingerprint, "the-default", "default"):
        assert pool.fingerprint_of(name) == enc.fingerprint
        assert pool.get(name) is enc
    assert pool.loads == 0 and pool._load.calls == []  # type: ignore[union-attr]


def test_an_unknown_model_is_refused_naming_every_served_model(tmp_path: Path) -> None:
    default, a = model_dir(tmp_path, "default", 64), model_dir(tmp_path, "a", 64, seed=1)
    pool, _ = pool_of(default, [a])
    fa = model_fingerprint(os.fspath(a))
    with pytest.raises(UnknownModel) as e:
        pool.get("bert-large")
    assert str(e.value) == (f"this worker serves 'default' ({pool.default.fingerprint}), "
                            f"{os.fspath(a)!r} ({fa}), not 'bert-large'")
    assert failure_type(e.value) == "internal"  # the worker turns it into a JobError (input) itself


def test_the_default_listed_again_among_the_others_is_served_once(tmp_path: Path) -> None:
    default, a = model_dir(tmp_path, "default", 64), model_dir(tmp_path, "a", 64, seed=1)
    pool, _ = pool_of(default, [default, a, a])
    assert list(pool.entries) == [model_fingerprint(os.fspath(a))]
    assert [d["path"] for d in pool.describe()] == [os.fspath(default), os.fspath(a)]


def test_a_pool_that_cannot_load_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    default, a = model_dir(tmp_path, "default", 64), model_dir(tmp_path, "a", 64, seed=1)
    pool = ModelPool(enc_of(default), [locate_model(os.fspath(a))])
    with pytest.raises(UnknownModel, match=r"^model '.*/a' is served but this worker cannot load models$"):
        pool.get(os.fspath(a))
    assert pool.confirm() is False  # nothing to reload with
    rewrite(default, 9)
    with caplog.at_level(logging.INFO, logger="layerbank.worker"):
        assert pool.confirm() is False and pool.default.fingerprint != model_fingerprint(os.fspath(default))
    assert caplog.records == []  # it goes on with the weights it loaded, which are its own


# -- loading, the budget, and what is published ------------------------------------------------

def test_loading_registers_logs_and_is_described(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    default, a, b = (model_dir(tmp_path, n, 4 * MiB, seed=i) for i, n in enumerate(["default", "a", "b"]))
    pool, registered = pool_of(default, [a, b])
    pool.default.name = "the encoder's own name"  # the display name is the one its info gives
    pool = ModelPool(pool.default, [ServedModel(locate_model(os.fspath(d)), os.fspath(d)) for d in (a, b)],
                     load=Loader(), on_load=lambda e: registered.append(e.fingerprint))
    fa, fb = (model_fingerprint(os.fspath(d)) for d in (a, b))
    assert pool.describe() == [
        {"name": "default", "path": os.fspath(default), "fingerprint": pool.default.fingerprint,
         "default": True, "loaded": True, "registered": True},
        {"name": os.fspath(a), "path": os.fspath(a), "fingerprint": fa, "default": False, "loaded": False,
         "registered": False},
        {"name": os.fspath(b), "path": os.fspath(b), "fingerprint": fb, "default": False, "loaded": False,
         "registered": False}]
    with caplog.at_level(logging.INFO, logger="layerbank.worker"):
        enc = pool.get("a")
    assert enc.fingerprint == fa and registered == [fa] and pool.loads == 1
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("layerbank.worker", f"loaded model {os.fspath(a)} (4.0 MiB); 2 of 3 models loaded, 8.0 MiB")]
    assert pool.get(fa) is enc and pool.loads == 1 and registered == [fa]
    desc = {d["fingerprint"]: (d["loaded"], d["registered"]) for d in pool.describe()}
    assert desc == {pool.default.fingerprint: (True, True), fa: (True, True), fb: (False, False)}
    assert pool.used_bytes == 8 * MiB


def test_the_least_recent_is_unloaded_when_the_newcomer_would_not_fit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    default, a, b, c = (model_dir(tmp_path, n, 4 * MiB, seed=i) for i, n in enumerate("dabc"))
    pool, _ = pool_of(default, [a, b, c], budget=12 * MiB)  # the default and two others exactly
    fa, fb, fc = (model_fingerprint(os.fspath(x)) for x in (a, b, c))
    pool.get("a")
    pool.get("b")
    assert list(pool.loaded) == [fa, fb] and pool.unloads == 0 and pool.used_bytes == 12 * MiB
    pool.get("a")  # now b is the least recent
    seen: list[list[str]] = []
    real = pool._load
    pool._load = lambda e: (seen.append(list(pool.loaded)), real(e))[1]  # type: ignore[misc,union-attr]
    with caplog.at_level(logging.INFO, logger="layerbank.worker"):
        pool.get("c")
    assert seen == [[fa]], "b was unloaded before c's weights were read, not after"
    pool._load = real
    assert list(pool.loaded) == [fa, fc] and pool.unloads == 1
    assert caplog.records[0].name == "layerbank.worker"
    assert caplog.records[0].getMessage() == f"unloaded model {os.fspath(b)} to stay within 12.0 MiB of encoders"
    # a model a job holds stays, the next least recent goes in its place
    pool.get("b", keep={fa})
    assert list(pool.loaded) == [fa, fb] and pool.unloads == 2
    pool.get("c", keep={fa, fb})  # nothing may go: over the budget for the job's time
    assert list(pool.loaded) == [fa, fb, fc] and pool.used_bytes == 16 * MiB
    pool.get("c")  # the jobs are over: back within the budget at the next use
    assert list(pool.loaded) == [fb, fc] and pool.used_bytes == 12 * MiB and pool.unloads == 3


def test_no_budget_unloads_nothing(tmp_path: Path) -> None:
    default, a, b = (model_dir(tmp_path, n, MiB, seed=i) for i, n in enumerate("dab"))
    pool, _ = pool_of(default, [a, b], budget=None)
    pool.get("a")
    pool.get("b")
    assert len(pool.loaded) == 2 and pool.unloads == 0


# -- a model's identity follows its files -------------------------------------------------------

def test_a_model_whose_files_changed_is_served_under_its_new_fingerprint(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    default, a = model_dir(tmp_path, "default", 64), model_dir(tmp_path, "a", 64, seed=1)
    pool, registered = pool_of(default, [a])
    old = pool.get("a").fingerprint
    assert pool.confirm() is False and pool.loads == 1  # unchanged: nothing done
    rewrite(a, 2)
    new = model_fingerprint(os.fspath(a))
    with caplog.at_level(logging.INFO, logger="layerbank.worker"):
        assert pool.confirm() is True
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.worker", "WARNING", f"the files of model {os.fspath(a)} changed (fingerprint {old} -> {new}); "
                                        "serving them under the new fingerprint")]
    assert list(pool.entries) == [new] and old not in pool.loaded and pool.unloads == 1
    assert old not in pool.registered
    assert [d["fingerprint"] for d in pool.describe()][1:] == [new]
    with pytest.raises(ModelChanged) as e:
        pool.get(old)
    assert str(e.value) == (f"the files of the model with fingerprint {old} have changed since this request "
                            f"was made (their fingerprint is now {new}); send it again")
    assert failure_type(e.value) == "unavailable"  # the job's error: retry as is, not the user's fault
    assert pool.get("a").fingerprint == new and registered == [old, new] and pool.loads == 2
    # changed again: a request made for the first files names where they are now
    rewrite(a, 3)
    newest = model_fingerprint(os.fspath(a))
    assert pool.confirm() is True and pool.unloads == 2  # the second files' weights, loaded, go too
    with pytest.raises(ModelChanged, match=f"is now {newest}\\)"):
        pool.get(old)
    # and restored to the first files: served again under their fingerprint
    rewrite(a, 1)
    assert model_fingerprint(os.fspath(a)) == old and pool.confirm() is True
    assert pool.get(old).fingerprint == old and old not in pool.retired


def test_models_not_on_local_disk_are_not_confirmed(tmp_path: Path) -> None:
    default = model_dir(tmp_path, "default", 64)
    cached = model_dir(tmp_path, "cached", 64, seed=1)
    hub = ServedModel(ModelSource("org/remote", "org/remote", None), "org/remote")
    from_cache = ServedModel(ModelSource("org/cached", "org/cached", cached, from_hf_cache=True), "org/cached")
    local = model_dir(tmp_path, "local", 64, seed=2)
    pool = ModelPool(enc_of(default), [hub, from_cache, locate_model(os.fspath(local))], load=Loader())
    rewrite(cached, 5)  # a hub id's fingerprint is its name: its files are the hub's revision
    assert pool.confirm() is False
    assert sorted(pool.entries)[:2] == ["hub:org/cached@main", "hub:org/remote@main"]
    rewrite(local, 6)  # a local model listed after them is still confirmed
    assert pool.confirm() is True and model_fingerprint(os.fspath(local)) in pool.entries


def test_a_load_that_finds_other_files_is_described_as_what_it_loaded(tmp_path: Path) -> None:
    default, a = model_dir(tmp_path, "default", 64), model_dir(tmp_path, "a", 64, seed=1)
    pool, registered = pool_of(default, [a])
    located = model_fingerprint(os.fspath(a))
    rewrite(a, 7)  # changed between start (located) and the first job (loaded)
    enc = pool.get(located)
    assert enc.fingerprint != located and registered == [enc.fingerprint]
    assert list(pool.entries) == [enc.fingerprint] and list(pool.loaded) == [enc.fingerprint]
    assert pool.retired == {located: enc.fingerprint} and pool.used_bytes == 128
    [entry] = pool.describe()[1:]
    assert (entry["fingerprint"], entry["loaded"], entry["registered"]) == (enc.fingerprint, True, True)


def test_the_default_whose_files_changed_is_loaded_again_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    default = model_dir(tmp_path, "default", 64)
    load = Loader()
    pool, registered = pool_of(default, [], load=load)
    old = pool.default
    rewrite(default, 4)
    with caplog.at_level(logging.INFO, logger="layerbank.worker"):
        assert pool.confirm() is True
    new = pool.default
    assert new is not old and new.fingerprint == model_fingerprint(os.fspath(default))
    assert load.calls == [os.fspath(default)] and pool.loads == 1 and registered == [new.fingerprint]
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.worker", "WARNING", f"the files of the default model default changed (fingerprint "
                                        f"{old.fingerprint} -> {new.fingerprint}); loading them again")]
    assert pool.retired == {old.fingerprint: new.fingerprint}
    assert pool.registered == {new.fingerprint} and pool.used_bytes == 64
    assert pool.get() is new and pool.describe()[0]["fingerprint"] == new.fingerprint
    with pytest.raises(ModelChanged):
        pool.get(old.fingerprint)
    assert pool.confirm() is False and pool.loads == 1  # loaded once, not at every job
    rewrite(default, 0)  # the first files back: served again, and no longer retired
    assert pool.confirm() is True and pool.default.fingerprint == old.fingerprint and pool.loads == 2
    assert pool.retired == {new.fingerprint: old.fingerprint}


def test_a_default_whose_changed_files_cannot_load_keeps_its_weights_until_they_can(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    default, a = model_dir(tmp_path, "default", 64), model_dir(tmp_path, "a", 64, seed=1)
    load = Loader()
    pool, registered = pool_of(default, [a], load=load)
    old = pool.default
    rewrite(a, 2)
    rewrite(default, 4)
    load.fail = OSError("truncated file")
    with caplog.at_level(logging.INFO, logger="layerbank.worker"):
        assert pool.confirm() is True  # a's change counts, though the default's reload failed
    assert pool.default is old and registered == [] and pool.loads == 0
    assert caplog.records[-1].levelname == "WARNING" and caplog.records[-1].getMessage() == (
        f"the default model's changed files cannot be loaded (truncated file); serving the weights "
        f"loaded before, under {old.fingerprint}, until they can")
    assert pool.confirm() is False and load.calls == [os.fspath(default)]  # not tried at every job
    load.fail = None
    rewrite(default, 5)  # other files again: tried again
    assert pool.confirm() is True and pool.default is not old and pool.loads == 1
