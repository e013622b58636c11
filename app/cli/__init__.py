"""The ``layerbank`` command line: ``main.py`` parses, one module per subcommand
(``register(subparsers)``).

May import everything in layerbank; torch only inside a subcommand that runs the encoder, after its
input is checked.
"""
