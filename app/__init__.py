"""Everything above the store that never runs the encoder in its own process: the HTTP API, the command line, the probe engine, the client.

May import ``layerbank.cache``; only ``cli/`` may import ``layerbank.workers`` (and torch through it); ``api/`` never imports torch.
"""
