"""The search strategies: the interface (``base``: ``Strategy``, ``KeyRun``, ``Searched``), the shipped ones and the
names the command line gives them (``registry``: ``FastStrategy``, ``TpeStrategy``, ``strategy_of``), and what they
run on: the search space (``space``), the objective (``objective``), one point as a trial (``evaluate``, ``record``),
the searches themselves (``fast`` with ``edge_search``, ``tpe``) and what they find (``outcome``).

``autotune.tune(bundles, strategy=FastStrategy())`` takes an object, as Optuna's ``create_study(sampler=...)`` does;
a name (``strategy="tpe"``, ``--strategy tpe``) stands for the shipped object.
"""

from __future__ import annotations

from autotune.lazy import lazy_exports

_EXPORTS = {
    "Strategy": "autotune.search.strategies.base",
    "KeyRun": "autotune.search.strategies.base",
    "Searched": "autotune.search.strategies.base",
    "FastStrategy": "autotune.search.strategies.registry",
    "TpeStrategy": "autotune.search.strategies.registry",
    "STRATEGIES": "autotune.search.strategies.registry",
    "strategy_named": "autotune.search.strategies.registry",
    "strategy_of": "autotune.search.strategies.registry",
    "SearchOutcome": "autotune.search.strategies.outcome",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
