"""Estimator answers an ``EstimateProber`` already holds, given again without another pass.

Where no device model applies, an estimate is the tracker's raw peak, and the same point asked
twice gets the same bytes. Two answers are in hand before the search asks for points:

- training at any N, from the replay curve of the one training trace (``autotune.probe.replay``:
  the tracker's peak at N, the number a pass at N gives);
- validation at a sliding-window batch and validation device, from any pass that traced it: the one
  folded into the training trace, a sliding-window curve's, an earlier point's. Validation's peak
  does not depend on the training batch (the training state it runs beside is the parameters',
  gradients' and optimizer's).

``RawAnswers.answer`` builds the result ``autotune.probe.estimate`` would return for such a point
(its keys, the point's resolved values, the pass's facts), with ``answered_by`` naming the source
and ``seconds`` the time the answer took.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.tunables import SW_BATCH, VALIDATION_DEVICE, Point

__all__ = ["RawAnswers", "infer_key"]

# what an estimate says of its pass rather than of its point: carried from the pass that answers
_PASS_KEYS = ("measured", "device_name", "device_total_memory", "torch_version", "monai_version", "semantics",
              "guessed_values_by_phase")


def infer_key(point: Mapping[str, Any] | Point) -> tuple[Any, Any]:
    """What validation's raw peak depends on among the tunables: the sliding-window batch and where the
    volume is held (left out: the compute device, as ``estimate`` reads it)."""
    values = point if isinstance(point, Point) else Point.taken_from(point)
    return values.get(SW_BATCH.name), values.get(VALIDATION_DEVICE.name) or "device"


class RawAnswers:
    """Raw estimates one prober made, by what they answer: the replay curve for training (and the result
    of its pass), validation peaks by ``infer_key`` (and the result each came with)."""

    def __init__(self) -> None:
        self.replay: Any = None
        self.replay_result: dict[str, Any] | None = None
        self.infer: dict[tuple[Any, Any], tuple[int, dict[str, Any]]] = {}

    def keep_replay(self, curve: Any, result: Mapping[str, Any]) -> None:
        """Keep the raw replay ``curve`` of the training pass that returned ``result``."""
        self.replay, self.replay_result = curve, _facts(result)

    def keep_infer(self, point: Mapping[str, Any] | Point, result: Mapping[str, Any]) -> None:
        """Keep the raw validation peak of ``result``, an estimate at ``point`` that traced validation."""
        raw = result.get("infer_peak_bytes")
        if raw is not None:
            self.infer.setdefault(infer_key(point), (int(raw), _facts(result)))

    def answer(self, bundle: str | Path, device: str, point: Mapping[str, Any],
               phases: tuple[str, ...]) -> dict[str, Any] | None:
        """The estimate's result at ``point`` for ``phases`` from an answer held (None: none held, run the
        estimator): training alone from the replay curve, validation alone from a peak at its ``infer_key``."""
        start = time.perf_counter()
        values = Point.taken_from(point)
        if tuple(phases) == ("train",) and self.replay is not None and values.num_patches_per_iter:
            raw, facts, source = int(self.replay.predict(int(values.num_patches_per_iter))), self.replay_result, "replay"
        elif tuple(phases) == ("infer",) and infer_key(values) in self.infer:
            (raw, facts), source = self.infer[infer_key(values)], "estimate"
        else:
            return None
        result = _result_at(bundle, device, values, tuple(phases), facts or {})
        guessed = {part: int(n) for part, n in (result.get("guessed_values_by_phase") or {}).items()
                   if part in ("build", phases[0])}
        result.update({f"{phases[0]}_peak_bytes": raw, "peak_bytes": raw, "guessed_values": sum(guessed.values()),
                       "guessed_values_by_phase": guessed, "answered_by": source,
                       "seconds": time.perf_counter() - start})
        return result

    def __len__(self) -> int:
        return len(self.infer) + (self.replay is not None)


def _facts(result: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``result`` that describe its pass."""
    return {key: result.get(key) for key in _PASS_KEYS}


def _result_at(bundle: str | Path, device: str, point: Point, phases: tuple[str, ...],
               facts: Mapping[str, Any]) -> dict[str, Any]:
    """An estimate's result at ``point`` before its peaks: the keys ``estimate`` starts from (the probe's
    ``base_result``: the point's values resolved against the bundle as ``estimate`` resolves them) and the
    answering pass's facts."""
    from autotune.probe import base_result, resolve_request

    point = point.with_values(**{VALIDATION_DEVICE.name: point.validation_device or "device"})
    req = resolve_request(bundle, point, device=device, memory_limit=None, phases=phases, warmup_steps=1,
                          measure_steps=1, check_device=False)
    return {**base_result(req), "status": "ok", **facts}
