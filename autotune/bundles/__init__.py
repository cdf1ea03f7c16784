"""Bundles, the low-level config model: algorithm templates (plain data, ``templates``) filled from data stats
into training configs (``render``, ``network``), a bundle config read and checked once (``config``), its typed
``tuning:`` block (``plan``) and the batch rules (``scaling``).

It imports nothing above it (``tests/test_layering.py``): MONAI Auto3DSeg's shapes over the bundles
(``BundleGen``, the ``Algo`` interface) are ``autotune.facade``, one level up.
"""
