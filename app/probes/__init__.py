"""The probe engine: heads (scikit-learn contract), scalar mix, logistic fitting, token probes, spans,
word sets, advice, plots, the probe job runner.

May import numpy, scikit-learn, matplotlib, ``layerbank.cache`` and ``layerbank.app.api``'s errors
and settings; never torch.
"""
