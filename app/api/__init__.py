"""The FastAPI service: routes, schemas, errors, settings, dependencies, micro-batcher, metrics, row
cache.

May import ``layerbank.cache`` and ``layerbank.app.probes`` (numpy and scikit-learn run off the
event loop); never torch or ``layerbank.workers``.
"""
