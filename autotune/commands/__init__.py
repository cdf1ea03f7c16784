"""CLI subcommands, one module per stage; each exposes ``register(subparsers)``.

Handlers take the parsed ``argparse.Namespace`` and return an exit code. They import
the library (and so torch) only when they run.
"""
