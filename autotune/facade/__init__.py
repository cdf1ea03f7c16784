"""MONAI Auto3DSeg's shapes over autotune's bundles, one level above them.

- ``bundlegen.py``: ``BundleGen``, shaped like ``monai.apps.auto3dseg.BundleGen``: fills the
  templates (``autotune.bundles``) into one bundle per algorithm and fold; ``get_history()`` gives
  MONAI-shaped items;
- ``algo.py``: MONAI's ``Algo`` interface over a bundle (``AutotuneAlgo``: train, score, predict
  with autotune's runner and inference) and the ``InferClass`` a bundle's ``scripts/infer.py`` loads;
- ``algo_params.py``: MONAI-style ``train_params`` / ``predict_params`` checked.

They sit above ``autotune.bundles`` (the config model: ``config``, ``plan``, ``render``,
``templates``, ``scaling``), ``autotune.trainer`` and ``autotune.build``, which never import them;
``autotune.BundleGen`` (``autotune.pipeline``) makes this ``BundleGen`` with ``autotune.tune`` as its
tuner (``autotune.pipeline.AutotuneBundleGen``) for autotune's templates.
"""
