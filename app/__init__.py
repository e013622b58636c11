"""Everything above the store that never runs the encoder in its own process: the HTTP API, the command
line, the probe engine, the client.

May import ``layerbank.cache``; only ``cli/`` and ``bank.py`` (the in-process store of
``layerbank.Bank``) may import ``layerbank.workers`` (and torch through it, on a cache miss);
``api/`` never imports torch.
"""
