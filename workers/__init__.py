"""Extraction workers: encoder loading, tokenizing, batching, pooling, shard writing; ``regimes/`` for
fine-tuning. Two axes are packages: ``backends/`` (where extraction runs: this
process or Ray actors) and ``engines/`` (what runs the forward pass: torch or ONNX).

May import torch, transformers and ``layerbank.cache``; never ``layerbank.app``.

Importing any ``workers`` module first sets two process-wide defaults for the
CPU libraries under torch, before torch loads them (a user's own values win;
they do nothing where torch was imported, or oneDNN used, before ``workers``):

- ``OMP_WAIT_POLICY=PASSIVE``: libgomp (torch's OpenMP) reads it once, at
  load. Threads waiting at the end of a parallel region sleep instead of
  spinning. On cores shared with other work a spinning thread takes the CPU
  its partner needs: on 2 shared cores at load ~8, 2 threads ran 2.1x slower
  than 1 when spinning, and as fast as 1 when passive (bench/extract.py).
- ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=16``: oneDNN keeps every primitive it
  builds, keyed by tensor shape, up to 1,024 of them (the CPU GELU is one,
  bf16 matrix products others). Length-sorted batches have a new shape nearly
  every batch, so the cache only grew: +1.1 GiB of RSS over 10,000 texts.
  16 keeps one forward pass's primitives and bounds the rest.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
