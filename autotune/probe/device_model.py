"""A CUDA device's peak memory from the estimator's recorded trace: what can be counted, counted.

The estimator (``autotune.probe.estimate``) counts live tensor storages. On a GPU,
``max_memory_reserved`` (what a memory limit binds) holds more, and each part is counted here
from the trace (``estimate(..., record=True)``), with CUDA's semantics, or calibrated where it
cannot be:

- **the caching allocator** (counted): requests rounded to 512 bytes, 2 MiB segments for small
  requests, 20 MiB or the request rounded to 2 MiB for large ones, best-fit splitting, freed blocks
  cached (``autotune.probe.allocator``). The probe's steps are replayed as the probe runs them:
  one warm-up and two measured loader batches, then validation's warm-up and two measured
  volumes, with training's cached blocks still reserved when validation starts (training
  validates so; nothing empties the cache between them).
- **cuDNN's algorithm search** (counted): under ``cudnn.benchmark`` each convolution
  configuration is searched once, the first time it runs, and PyTorch empties the allocator's
  cache after a search (``emptyCache`` in ``aten/src/ATen/native/cudnn/Conv_v7.cpp``): every
  wholly free segment goes back to the driver. The first GPU run supports it: validation's
  reserved memory fell below training's (SegResNet N=4: 64.40 GB reserved after validation
  against 72.73 GB after training), which only such a release explains, and the model with it
  predicts the measured reserved peaks far better than without (``benchmarks/gpu_model.py``).
- **cuDNN's workspaces** (calibrated): while a convolution runs, its algorithm holds a workspace
  from the allocator; its size is cuDNN's choice per GPU and configuration, which a CPU cannot
  know. It is taken as ``w`` times the convolution's largest activation operand (input, output
  or their gradients), with ``w`` fitted per template and phase on the GPU
  (``autotune calibrate``); a workspace is placed in the simulated allocator where its
  convolution runs. Whether a workspace fits a cached block or needs a segment of its own
  makes the reserved peak jump with small changes of its size, so the prediction is the mean
  over ``w`` times ``BAND`` (about the spread of ``w`` between the points it is fitted to).

The CUDA context (outside the allocator) is not in these figures: ``allocator_budget`` takes it
off the limit. This module counts a trace it is given and imports nothing above it; the estimate with these
figures added (``estimate_on_device``: the estimator run, the calibration's factors chosen) is
``autotune.probe.device_estimate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.probe.allocator import Allocator

__all__ = ["BAND", "PHASES", "SETUP_LABELS", "DeviceFigures", "simulate", "device_figures", "predict_reserved",
           "explain_terms"]

PHASES = ("train", "infer")
BAND = (0.8, 0.9, 1.0, 1.1, 1.2)
SETUP_LABELS = frozenset({"state", "loader", "volume"})
REPEATS = 3  # the probe's warm-up and two measured loader batches (volumes)

Event = tuple[str, int, int, str]


@dataclass(frozen=True)
class DeviceFigures:
    """The simulated allocator's peaks of one phase (bytes): ``allocated`` (``max_memory_allocated``),
    ``reserved`` (``max_memory_reserved``), and ``reserved_after`` (what it holds when the phase ends)."""

    allocated: int
    reserved: int
    reserved_after: int


def _setup_end(events: Sequence[Event]) -> int:
    """Index of the first event after the leading storages that exist before the phase (state, loader, volume)."""
    index = 0
    while index < len(events) and events[index][0] == "alloc" and events[index][3] in SETUP_LABELS:
        index += 1
    return index


class _Run:
    """One probe's worth of allocator traffic: the phases replayed in order on one ``Allocator``."""

    def __init__(self, workspace: Mapping[str, float], release: bool, expandable: bool) -> None:
        self.alloc = Allocator(expandable=expandable)
        self.workspace, self.release = workspace, release
        self.searched: set[tuple[str, int]] = set()
        self.kept: list[object] = []  # blocks a step left that no later step frees (never matched)

    def step(self, phase: str, events: Sequence[Event], start: int, held: dict[int, object]) -> dict[int, int]:
        """Replay ``events[start:]`` once; ``held`` maps the slots of storages from before the step to their
        blocks (updated when the step frees them). Returns the step's own storages still alive (slot -> bytes)."""
        alloc, own = self.alloc, {}
        factor = float(self.workspace.get(phase, 0.0))
        for kind, slot, size, _ in events[start:]:
            if kind == "work":
                if (phase, slot) not in self.searched:  # cuDNN's search, then the allocator's cache emptied
                    self.searched.add((phase, slot))
                    if self.release:
                        alloc.empty_cache()
                if factor > 0:
                    alloc.transient(int(factor * size))
                continue
            if kind in ("free", "grow"):
                if slot in own:
                    alloc.free(("own", slot))
                    own.pop(slot)
                elif slot in held:
                    alloc.free(held.pop(slot))
            if kind in ("alloc", "grow"):
                alloc.malloc(("own", slot), size)
                own[slot] = size
        return own

    def keep(self, own: Mapping[int, int], freed_sizes: list[tuple[int, int]], held: dict[int, object],
             round_index: int) -> None:
        """After a step: its surviving storages (new gradients, optimizer state) become held blocks; each takes
        the slot of a storage of the same size the step freed, so the next step frees it as it freed that one."""
        alloc, taken = self.alloc, set()
        for slot, size in sorted(own.items()):
            key = ("kept", round_index, slot)
            alloc.rename(("own", slot), key)
            match = next((old for old, old_size in freed_sizes if old_size == size and old not in taken), None)
            if match is not None:
                taken.add(match)
                held[match] = key
            else:
                self.kept.append(key)


def simulate(train_events: Sequence[Event] | None, infer_events: Sequence[Event] | None,
             workspace: Mapping[str, float], *, release: bool = True, expandable: bool = False,
             repeats: int = REPEATS) -> dict[str, DeviceFigures]:
    """The allocator's peaks of a probe whose phases allocate as ``train_events`` and ``infer_events``
    (either may be None), with cuDNN's workspace ``workspace[phase]`` times each convolution's largest
    activation operand (the module docstring). ``release``: empty the cache after each first search."""
    run, out = _Run(workspace, release, expandable), {}
    alloc = run.alloc
    held: dict[int, object] = {}
    if train_events:
        start = _setup_end(train_events)
        setup = train_events[:start]
        sizes = {slot: size for _, slot, size, _ in setup}
        loader = {slot for _, slot, _, label in setup if label == "loader"}
        steps = [e for e in train_events if not (e[0] == "free" and e[1] in loader)]  # freed after the phase
        for _, slot, size, _ in setup:
            alloc.malloc(("setup", slot), size)
            held[slot] = ("setup", slot)
        alloc.reset_peaks()
        for index in range(repeats):
            before = dict(held)
            own = run.step("train", steps, start, held)
            freed = [(slot, sizes.get(slot, -1)) for slot in before if slot not in held]
            run.keep(own, freed, held, index)
        out["train"] = DeviceFigures(alloc.peak_allocated, alloc.peak_reserved, alloc.reserved)
        for slot in loader:
            if slot in held:
                alloc.free(held.pop(slot))
    if infer_events:
        start = _setup_end(infer_events)
        volume: dict[int, object] = {}
        for _, slot, size, label in infer_events[:start]:
            if label == "volume" or not train_events:  # training's state is already held when training ran
                alloc.malloc(("volume", slot), size)
                volume[slot] = ("volume", slot)
        alloc.reset_peaks()
        for _ in range(repeats):
            own = run.step("infer", infer_events, start, volume)
            for slot in own:
                alloc.free(("own", slot))
        out["infer"] = DeviceFigures(alloc.peak_allocated, alloc.peak_reserved, alloc.reserved)
    return out


def predict_reserved(train_events: Sequence[Event] | None, infer_events: Sequence[Event] | None,
                     workspace: Mapping[str, float], *, band: Iterable[float] = BAND, release: bool = True,
                     expandable: bool = False) -> dict[str, dict[str, float]]:
    """Per phase, the mean over ``band`` (multipliers of ``workspace``) of the simulated peaks:
    ``{"train": {"allocated": ..., "reserved": ...}, "infer": {...}}`` (phases without events left out)."""
    totals: dict[str, dict[str, float]] = {}
    factors = list(band) or [1.0]
    for factor in factors:
        scaled = {phase: float(w) * factor for phase, w in workspace.items()}
        for phase, figures in simulate(train_events, infer_events, scaled, release=release,
                                       expandable=expandable).items():
            entry = totals.setdefault(phase, {"allocated": 0.0, "reserved": 0.0})
            entry["allocated"] += figures.allocated / len(factors)
            entry["reserved"] += figures.reserved / len(factors)
    return totals


def device_figures(result: Mapping[str, Any], workspace: Mapping[str, float], *, release: bool = True,
                   expandable: bool = False) -> dict[str, Any]:
    """``{phase}_device_allocated_bytes`` and ``{phase}_device_reserved_bytes`` for the phases an
    ``estimate(..., record=True)`` result traced, and ``device_peak_bytes`` (the larger reserved peak).

    Raises:
        ValueError: the result holds no recorded events.
    """
    train, infer = result.get("train_events"), result.get("infer_events")
    if not train and not infer:
        raise ValueError("the estimate recorded no events: call estimate(..., record=True)")
    figures = predict_reserved(train, infer, workspace, release=release, expandable=expandable)
    out: dict[str, Any] = {}
    for phase, entry in figures.items():
        out[f"{phase}_device_allocated_bytes"] = int(round(entry["allocated"]))
        out[f"{phase}_device_reserved_bytes"] = int(round(entry["reserved"]))
    out["device_peak_bytes"] = max(out[f"{p}_device_reserved_bytes"] for p in figures)
    return out


def explain_terms(result: Mapping[str, Any], workspace: Mapping[str, float], *, release: bool = True,
                  expandable: bool = False) -> dict[str, dict[str, int]]:
    """Per phase of an ``estimate(..., record=True)`` result, the device model's reserved peak term by term,
    each the difference the term makes when added to the ones before it:

    - ``tensors``: the estimator's live tensor storages (its raw peak);
    - ``allocator``: what the caching allocator reserves beyond them (rounding, segments, blocks cached
      between steps and kept from training into validation), without cuDNN's cache release;
    - ``cudnn_release``: what the release after each new convolution's algorithm search gives back (negative);
    - ``workspace``: cuDNN's workspace at ``workspace[phase]`` times each convolution's largest activation.

    They add up to ``reserved`` (``{phase}_device_reserved_bytes`` of ``device_figures``) exactly."""
    train, infer = result.get("train_events"), result.get("infer_events")
    zero = {"train": 0.0, "infer": 0.0}
    bare = predict_reserved(train, infer, zero, band=(1.0,), release=False, expandable=expandable)
    released = predict_reserved(train, infer, zero, band=(1.0,), release=release, expandable=expandable)
    full = predict_reserved(train, infer, workspace, release=release, expandable=expandable)
    out: dict[str, dict[str, int]] = {}
    for phase, entry in full.items():
        tensors = int(result[f"{phase}_peak_bytes"])
        reserved = int(round(entry["reserved"]))
        allocator = int(round(bare[phase]["reserved"])) - tensors
        cudnn_release = int(round(released[phase]["reserved"])) - int(round(bare[phase]["reserved"]))
        out[phase] = {"tensors": tensors, "allocator": allocator, "cudnn_release": cudnn_release,
                      "workspace": reserved - tensors - allocator - cudnn_release, "reserved": reserved}
    return out
