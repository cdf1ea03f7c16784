"""Data stage: read a dataset (input.yaml, datalist JSON or Decathlon folder), check it, analyse it.

``load_data_source`` gives a ``DataSource`` with absolute paths and folds; ``check_cases``
checks every image and label; ``analyze`` writes ``datastats.yaml`` (MONAI Auto3DSeg's
statistics) into a work folder; ``make_demo_dataset`` writes a small synthetic dataset.
Nothing here imports torch until ``analyze`` runs the analyzer.
"""

from __future__ import annotations

from autotune.data.analyze import AnalysisResult, analyze, content_hash
from autotune.data.datalist import (
    MODALITIES,
    DataSource,
    assign_folds,
    load_data_source,
    normalise_modality,
    write_data_src_config,
    write_datalist,
)
from autotune.data.synthetic import make_demo_dataset
from autotune.data.validate import CaseInfo, check_case, check_cases

__all__ = [
    "MODALITIES",
    "AnalysisResult",
    "CaseInfo",
    "DataSource",
    "analyze",
    "assign_folds",
    "check_case",
    "check_cases",
    "content_hash",
    "load_data_source",
    "make_demo_dataset",
    "normalise_modality",
    "write_data_src_config",
    "write_datalist",
]
