"""Fine-tuning regimes (frozen, BitFit, LoRA, top-k, gradual, full) measured side by side, and the
worker job that runs them.

May import torch, peft, scikit-learn, ``layerbank.cache`` and ``layerbank.workers``; never
``layerbank.app``.
"""
