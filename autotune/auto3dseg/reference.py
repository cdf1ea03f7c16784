"""The batch a MONAI template states and the learning-rate rule its optimizer takes: the hand-off's reference.

MONAI's templates state a batch and a learning rate, and let only their ``auto_scale_*`` change the batch
(by a memory formula; the learning rate stays). autotune turns that formula off when it writes back, so the
stated batch is the reference the goodput hand-off (``autotune.search.handoff``) must beat, as the
template's own batch is for autotune's templates:

- **SegResNet** (``Segmenter.train_epoch``): one optimizer step per loader batch of ``batch_size``
  (``@num_images_per_batch``) x ``num_crops_per_image`` patches (split into ``num_steps_per_image`` steps
  when that is set);
- **DiNTS** (``train.py``): the loader batch of ``num_images_per_batch`` x ``num_crops_per_image`` patches is
  stepped through in passes of ``num_patches_per_iter``; each pass is one optimizer step.

The learning-rate rule follows the optimizer, as DeepSpeed's batch-size guidance states it: square root for
the Adam family (SegResNet's AdamW), linear for SGD (DiNTS), none for an optimizer the rule does not know
(the learning rate then stays the template's). MONAI's templates have no warm-up key autotune could write,
so the block's ``warmup_epochs`` is 0 (SegResNet warms up by its own schedule; DiNTS does not).

The reference is read from the configs as generated: once autotune has written tuned values into them, the
configs no longer say it, so the first tuning records it in ``autotune/tuning.yaml`` (``recipe.reference``)
and every later read takes it from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SQRT_OPTIMIZERS", "LINEAR_OPTIMIZERS", "lr_rule_of", "stated_reference", "reference_block",
           "recorded_reference"]

#: optimizers (``_target_`` class names, lower case) whose learning rate scales by sqrt(N / N_ref)
SQRT_OPTIMIZERS = ("adam", "adamw", "nadam", "radam", "adamax", "novograd", "lamb")
#: ... and by N / N_ref
LINEAR_OPTIMIZERS = ("sgd",)


def lr_rule_of(optimizer: str) -> str:
    """``sqrt`` for the Adam family, ``linear`` for SGD, ``none`` for an optimizer the rules do not name."""
    name = str(optimizer).rsplit(".", 1)[-1].lower()
    if name in SQRT_OPTIMIZERS:
        return "sqrt"
    if name in LINEAR_OPTIMIZERS:
        return "linear"
    return "none"


def stated_reference(template: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``batch_scaling`` block of a template's values as its configs state them (``view``'s readers).

    ``values["batch_source"]`` says which keys gave the batch; ``values["num_patches_per_iter"]`` is it.
    """
    optimizer = str((values.get("optimizer") or {}).get("name") or "")
    rule = lr_rule_of(optimizer)
    return {
        "reference_batch": max(1, int(values["num_patches_per_iter"])),
        "reference_learning_rate": float(values["learning_rate"]),
        "lr_scaling": rule,
        "warmup_epochs": 0.0,
        "source": f"MONAI's {template} template as generated: {values.get('batch_source', 'its stated batch')}",
        "optimizer": optimizer,
        "lr_rule_reason": {"sqrt": f"{optimizer} (Adam family): lr x sqrt(N / N_ref)",
                           "linear": f"{optimizer}: lr x N / N_ref",
                           "none": f"{optimizer}: no rule known for it; the learning rate stays"}[rule],
    }


def recorded_reference(tuning: Any) -> dict[str, Any] | None:
    """The reference a tuning record kept (``recipe.reference``), or None."""
    if not isinstance(tuning, Mapping):
        return None
    recipe = tuning.get("recipe")
    reference = recipe.get("reference") if isinstance(recipe, Mapping) else None
    return dict(reference) if isinstance(reference, Mapping) else None


def reference_block(template: str, values: Mapping[str, Any], tuning: Any) -> dict[str, Any] | None:
    """The bundle's reference: recorded by an earlier tuning, else stated by its configs (as generated).

    Returns None for a bundle tuned before the reference was recorded: its configs hold the tuned values,
    not the template's, so no reference can be read (the hand-off then says so and hands over the largest fit).
    """
    recorded = recorded_reference(tuning)
    if recorded is not None:
        return recorded
    if tuning is not None:
        return None
    return stated_reference(template, values)
