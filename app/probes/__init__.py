"""The probe engine as a library: heads (scikit-learn contract), scalar mix, token
probes, spans, word sets, advice, plots; the logistic fitting they share with the ``frozen``
regime is ``layerbank.linear_probe``.

May import numpy, scikit-learn, matplotlib and ``layerbank.cache``; never torch, and nothing of
``layerbank.app.api`` (tests/unit/test_import_rules.py): the job plumbing that serves probes over
HTTP (requests, the process pool, jobs, heads storage) is ``layerbank.app.api.probe_jobs``, so
``layerbank probe`` builds its result without FastAPI.
"""
