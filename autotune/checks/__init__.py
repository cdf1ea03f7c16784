"""The validation layer: every value that comes from outside autotune is checked here, once, at load.

One checker per kind of value, each in one place:

- ``values``: finite numbers in a range, whole numbers, true/false, names from a list, text;
- ``units``: sizes (``8GiB``) and durations (``30m``);
- ``places``: devices, ports, hosts, paths and storage URLs;
- ``tree``: walks over loaded files that visit each shared node once (NaN and infinity,
  ``$`` expressions);
- ``bounded_yaml``: YAML within limits on size, nodes after alias expansion and nesting;
- ``environment``: the ``AUTOTUNE_*`` settings, one table;
- ``options``: the same checkers as the command line's argparse types.

A refused value raises an ``autotune.errors.AutotuneError`` subclass whose message is one line
naming the file or option, the key, the value and what is allowed; the CLI prints it and
exits with code 2. This package imports nothing heavy (argparse, yaml; SQLAlchemy only to
read a storage URL), so the command line can check its options before anything is loaded.
"""

from __future__ import annotations

from autotune.checks.places import device, host, path, port, storage_url
from autotune.checks.tree import leaves, refuse_expressions, refuse_non_finite
from autotune.checks.units import byte_size, duration
from autotune.checks.values import (
    Choice,
    Flag,
    Integer,
    Items,
    Number,
    Text,
    Triple,
    choice,
    flag,
    integer,
    is_number,
    number,
    refuse,
    text,
)

__all__ = [
    "Choice", "Flag", "Integer", "Items", "Number", "Text", "Triple", "byte_size", "choice", "device", "duration", "flag",
    "host", "integer", "is_number", "leaves", "number", "path", "port", "refuse", "refuse_expressions",
    "refuse_non_finite", "storage_url", "text",
]
