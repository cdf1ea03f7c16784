"""The searcher: one Optuna study per tuning key and phase, strategies that ask the probe for points,
the hand-off to training, and write-back of the plan into the bundles.

Its families, lowest first (a family imports only the ones above it in this list):

- ``storage/``: the Optuna storage, tuning keys and studies (``study``), worker liveness
  (``liveness``) and claims (``claims``), for many workers on one storage;
- ``curves/``: the estimator's memory curves (``edge``: corrected curves and the bisection over
  them; ``sparse``: a curve from a few estimates; ``key_curves``: a key's curves, kept in its
  study; ``bound``: a calibration's stated bound) and the probers that answer points
  (``probers``: real probes or estimates);
- ``strategies/``: the search space (``space``), the objective (``objective``), one point as a
  trial (``evaluate``; what that trial records: ``record``), and the strategies ``fast`` (with
  ``edge_search``; ``estimate`` is fast answered by the estimator) and ``tpe``, behind one
  interface looked up by name (``registry``);
- ``handoff``: which batch training gets, with the learning rate and schedule that follow it;
- ``dashboard/``: the notes and memory plots optuna-dashboard shows;
- ``driver/``: the tuning options declared once (``options``), a tuning run (``session``), grouping bundles by key (``bundles``), one key
  (``key``, ``strategy_run``), the write-back (``writeback``), ``verify``, the printed table
  (``report``) and the GPU catalogue for plans (``targets``).

The public entry points are ``autotune.tune``, ``autotune.tune_worker`` and ``autotune.verify``
(``autotune/stages.py``); this package offers what they call.
"""

from __future__ import annotations

from autotune.lazy import lazy_exports

__all__ = ["SearchSettings", "STRATEGIES", "check_method", "search_bundles", "verify_plan", "resolve_target", "format_results"]

_EXPORTS = {
    "SearchSettings": "autotune.search.driver.bundles",
    "STRATEGIES": "autotune.search.driver.bundles",
    "search_bundles": "autotune.search.driver.bundles",
    "check_method": "autotune.search.driver.bundles",
    "verify_plan": "autotune.search.driver.verify",
    "resolve_target": "autotune.search.driver.targets",
    "format_results": "autotune.search.driver.report",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
