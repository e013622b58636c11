"""Engines: what runs the encoder's forward pass and returns every hidden state.

``torch`` runs the Hugging Face model as loaded; ``onnx`` runs a graph
exported from the same weights through ONNX Runtime (onnx.py), which on the
CPUs measured multiplies fp32 matrices about twice as fast as torch's MKL
path. ``auto`` times both on the model's own shapes at first start and keeps
the faster (choice.py). Either way the encoder pools the hidden states the
same way (workers/pooling.py); engines differ by under 1e-4 relative, so the
engine is not part of the key (docs/decisions.md).

May import torch, onnxruntime and ``layerbank.cache``; never ``layerbank.app``.
"""

ENGINE_CHOICES = ("auto", "torch", "onnx")

__all__ = ["ENGINE_CHOICES"]
