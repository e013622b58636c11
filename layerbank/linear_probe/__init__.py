"""The frozen linear probe's fitting: L2 logistic regression (logistic.py) over standardised rows (standardize.py).

One implementation for every frozen probe: the probe sweep and heads (app/probes),
the token probe, and the ``frozen`` regime (workers/regimes), which may not import
``app/``; so it lives here, beside the other torch-free shared modules. Imports
numpy, scipy and scikit-learn only, and only when a submodule is imported
(``import layerbank`` does not load it).
"""
