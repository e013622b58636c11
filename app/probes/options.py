"""What a sentence probe sweeps and how: one options object instead of a dozen arguments.

``ProbeOptions`` holds the choices a person makes (views, poolings, head,
folds, seed, control task, learning curve) and the two that only say how to
run (BLAS ``threads``, parallel ``n_jobs``). The HTTP request model
(``layerbank.app.api.probe_jobs.requests.ProbeCreate``) checks a request and becomes
a job payload; ``from_payload`` turns that payload into these options, so the
job, the CLI and ``Bank.probe`` hand ``run_probe`` the same object.

No numpy or scikit-learn here: the API and the CLI import it cheaply.

Example::

    opts = ProbeOptions(views=["each_layer", "scalar_mix"], cv=3)
    run_probe(states.__getitem__, labels, opts, progress=print)
    run_probe(states.__getitem__, labels, views=["each_layer"], cv=3)   # the same, as keywords
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ProbeOptions"]


@dataclass(frozen=True)
class ProbeOptions:
    """A sentence probe's sweep; see ``layerbank.app.probes.sweep.run_probe``."""

    views: Sequence[str]
    poolings: Sequence[str] = ("mean", "cls")
    head: str = "logistic"
    cv: int = 5
    seed: int = 0
    control_task: bool = True
    learning_curve: bool = True
    mdl: bool = True  # online codelength per view (layerbank.app.probes.mdl)
    train_sizes: Sequence[int] = (50, 100, 200, 500, 1000)
    threads: int | None = 1  # BLAS threads per fit (None: the library's default)
    n_jobs: int | None = None  # fits at once (None: sweep.default_jobs())
    # what the states were stored as: heads and MDL leave out dimensions below its resolution
    storage_dtype: str = "float16"

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], **how: Any) -> ProbeOptions:
        """The options a probe job's payload (made by requests.sentence_payload) asks for;
        ``how``: threads / n_jobs for where it runs."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in payload.items() if k in names}, **how)
