"""The feature store: HDF5 shard format, catalog (SQLite), keys, views, datasets, and the job queue
(``jobs.py``: a catalog table, so app/ and workers/ meet here without importing each other).

Imports only numpy, h5py, the database driver and the standard library; nothing else of layerbank.
"""
