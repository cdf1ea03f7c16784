"""Calibrate stage: measure the device model's calibrated part (cuDNN's workspace per template and phase) on
this GPU, in a few minutes, and write it where autotune reads calibrations (``autotune calibrate``).

- ``data``: the synthetic CT set and the full-size bundles the points are measured on;
- ``points``: one real probe and the estimator's trace per point;
- ``fit``: the device model's factors, their error in-sample and leave one out, the version-2 file;
- ``run``: ``calibrate``, the whole of it.
"""

from __future__ import annotations

from autotune.calibrate.run import TEMPLATES, calibrate, per_template_lines, user_folder

__all__ = ["TEMPLATES", "calibrate", "per_template_lines", "user_folder"]
