"""Probe and head jobs behind ``/v1/probes``, ``/v1/heads`` and ``/v1/regimes``: the job plumbing
next to the routes that use it.

``requests`` checks a request and costs it (``memory_cost``) before anything is queued,
``service`` runs the process pool that claims the jobs, ``jobs`` is what a pool process runs,
``heads_store`` keeps the fitted heads' files and rows. The science they call (heads, sweeps,
MDL, token probes, plots) is ``layerbank.app.probes``, which imports nothing of ``layerbank.app.api``.

May import ``layerbank.cache``, ``layerbank.app.probes`` and the rest of ``layerbank.app.api``;
never torch. ``service`` imports no numpy (a pool process sets its BLAS threads before numpy loads).
"""
