"""Names a package exports lazily (PEP 562), so that importing it imports none of the modules behind them.

A package's ``__init__.py`` names each public name's module once and takes its ``__getattr__`` and
``__dir__`` from here::

    _EXPORTS = {"train": "autotune.trainer.runner", "infer": "autotune.trainer.infer"}
    __all__ = list(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

A name is looked up in its module each time it is asked for (nothing is cached in the package), so the
package always answers what the module holds. This module imports nothing of autotune.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str],
                 listed: Iterable[str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__`` (for the error message).
        exports: public name -> the module that defines it, imported when the name is first asked for.
        listed: what ``dir(package)`` lists (default the names of ``exports``), usually its ``__all__``.

    Returns:
        ``__getattr__`` (a name of ``exports`` from its module; any other name raises ``AttributeError``) and
        ``__dir__`` (``listed``, sorted).
    """
    table = dict(exports)
    shown = sorted(table if listed is None else listed)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return list(shown)

    return __getattr__, __dir__
