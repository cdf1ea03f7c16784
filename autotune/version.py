"""The package's version, in a module of its own so that any module can read it without importing
``autotune``'s public names (``pyproject.toml`` holds the same string)."""

__version__ = "0.1.0"
