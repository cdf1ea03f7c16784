"""Build a MONAI bundle's own network, loss, accuracy and optimizer, as its ``scripts/`` build them.

The bundle's template (``autotune.auto3dseg.templates``) builds them from MONAI's ``ConfigParser`` over the
bundle's configs (``MonaiTemplate.build``: SegResNet as ``Segmenter.setup_model``, DiNTS and SwinUNETR as their
``train.py``). The probe builds these on its device (``probe_parts``); the estimator builds them on the meta
device and gives them fake parameters (``fake_parts``), with the template's data-dependent branches made plain
values (``MonaiTemplate.static_topology``: DiNTS's topology tests).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.auto3dseg.templates import template_named
from autotune.auto3dseg.view import read_parser, template_of

if TYPE_CHECKING:  # pragma: no cover
    from autotune.bundles.model import BundleConfig

__all__ = ["build_model_loss_optimizer", "probe_parts", "fake_parts"]


def build_model_loss_optimizer(config: BundleConfig, device: str, *, static_topology: bool = False,
                               on_meta: bool = False) -> tuple[Any, Any, Any, Any]:
    """The bundle's (network, loss, optimizer, accuracy); the network on ``device`` (``on_meta``: on the meta
    device, for the estimator). ``static_topology``: plain-value path tests (fake tensors).

    Raises:
        ConfigError: one line when autotune does not tune the bundle's template.
    """
    import torch

    root = Path(config.bundle_root)  # recognised by load_view; the pickle's hash is checked again
    template = template_named(template_of(config), root)
    parser = read_parser(root, template.name, "cpu" if on_meta else device, config.arch_code_sha256)
    if static_topology:
        template.static_topology(parser)
    torch.manual_seed(config.seed)
    context = torch.device("meta") if on_meta else contextlib.nullcontext()
    with context:
        model, loss, optimizer_part, accuracy = template.build(parser, config)
        if not on_meta:
            model = model.to(device)
        model = template.placed(model, config)
    return model, loss, optimizer_part, accuracy


def probe_parts(config: BundleConfig, device: Any, amp_dtype: Any) -> dict[str, Any]:
    """What the probe's child runs for a MONAI bundle: its ``_build`` keys plus ``workload`` (the template's step)."""
    from autotune.auto3dseg.workload import MonaiWorkload

    model, loss, optimizer_part, accuracy = build_model_loss_optimizer(config, str(device))
    optimizer = optimizer_part.instantiate(params=model.parameters())
    return {"device": device, "model": model, "loss_fn": loss, "optimizer": optimizer, "amp_dtype": amp_dtype,
            "scaler": None, "workload": MonaiWorkload(config, loss, accuracy, host="cpu")}


def fake_parts(config: BundleConfig, compute: str, emulate: bool) -> tuple[Any, Any, Any, Any]:
    """(model, loss, optimizer, workload) for the estimator, inside its fake session: built on the meta device,
    then given fake parameters on ``compute``. ``emulate``: a CUDA target on the CPU (host tensors on meta)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from autotune.auto3dseg.workload import MonaiWorkload

    with unset_fake_temporarily():
        model, loss, optimizer_part, accuracy = build_model_loss_optimizer(config, compute, static_topology=True,
                                                                            on_meta=True)
    model = model._apply(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=compute))
    for module in model.modules():  # DiNTS keeps its architecture code as plain tensors on the device
        for name in ("arch_code_a", "arch_code_c"):
            code = getattr(module, name, None)
            if isinstance(code, torch.Tensor):
                setattr(module, name, torch.empty_strided(code.shape, code.stride(), dtype=code.dtype, device=compute))
    optimizer = optimizer_part.instantiate(params=model.parameters())
    return model, loss, optimizer, MonaiWorkload(config, loss, accuracy, host="meta" if emulate else "cpu")
