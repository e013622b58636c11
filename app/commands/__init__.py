"""The ``layerbank`` subcommands, one module each (``register(subparsers)``)."""
