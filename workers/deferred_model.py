"""A torch model read from its files the first time something needs it.

An encoder started on its checked ONNX export (workers/quick_start.py)
computes fp32 rows without the torch model, so the worker is ready before
transformers' modeling code is even imported (~3 s of a 6 s start on the
2-core development machine). What does need the weights (bf16 or fp16
rows, the regimes, a new engine check) asks ``Encoder.torch_model()``,
which loads them here once, under a lock, and keeps them.

Attribute access and calls are passed on to the loaded model, so code that
only reads ``encoder.model.config`` or calls it works unchanged; code that
needs the module itself (its type, isinstance, training) calls ``get()``.

Example::

    model = DeferredModel(lambda: AutoModel.from_pretrained(path), nbytes=90_000_000)
    model.loaded          # False: nothing read yet
    model.config          # reads the weights now, then answers from them
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DeferredModel"]


class DeferredModel:
    """Stands for a torch model until it is first used; ``get()`` loads (once) and returns it."""

    def __init__(self, load: Callable[[], Any], nbytes: int) -> None:
        # set through __dict__: __getattr__ below must never see these missing
        self.__dict__.update(_load=load, _model=None, _lock=threading.Lock(), nbytes=nbytes)

    @property
    def loaded(self) -> bool:
        return self.__dict__["_model"] is not None

    def get(self) -> Any:
        """The torch model, read from its files on the first call (other threads wait for it)."""
        model = self.__dict__["_model"]
        if model is not None:
            return model
        with self.__dict__["_lock"]:
            if self.__dict__["_model"] is None:
                self.__dict__["_model"] = self.__dict__["_load"]()
            return self.__dict__["_model"]

    def __getattr__(self, name: str) -> Any:  # only for names this object does not have
        if name.startswith("__"):
            raise AttributeError(name)  # copy/pickle probes: not a reason to read the weights
        return getattr(self.get(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.get()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"DeferredModel(loaded={self.loaded})"
