"""The feature store: HDF5 shard format, catalog (SQLite), keys, views, datasets, jobs table.

Imports only numpy, h5py, the database driver and the standard library; nothing else of layerbank.
"""
