"""Non-finite losses and gradients never reach the weights: the check each training step makes.

``StepGuard`` stands between a step's backward pass and its optimizer step. A step whose loss
is NaN or Inf, or whose gradients hold one (without a GradScaler; with one, fp16's scaler skips
such steps itself and lowers its scale), is not applied: its gradients are dropped and the
buffers its forward pass changed (BatchNorm's running statistics) are put back,
so weights, buffers and optimizer state stay as they were. With several processes the ranks
agree on every skip (one small all-reduce), so they skip the same steps and stay in step.

A skipped step or two is a bad batch; ``NONFINITE_PATIENCE`` in a row is a run that diverged:
a skipped step leaves the weights as they were, so the next batches meet the same weights
that failed on every batch since, and more waiting only burns time. The guard then raises
``NonFiniteSteps``; the trainer turns it into one line and exit code 5
(``autotune.errors.TrainingDiverged``), naming where the last of them first went non-finite
(``trace_nonfinite``: forward and backward hooks on every module). The probe makes no skips (a skipped step would
leave the optimizer's state unallocated and the memory it measures short): a probe whose
loss or weights are non-finite after its steps is recorded as ``nonfinite``, never as a fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["NONFINITE_PATIENCE", "NonFiniteSteps", "StepGuard", "nonfinite_parameters", "trace_nonfinite"]

# Steps in a row that may be skipped before the run stops. One or two in a row happen (a crop of
# extreme values, a warm-up spike) and skipping them costs nothing. Five in a row means five
# different batches all failed on the same, unchanged weights: the weights are the cause and a
# sixth batch meets them too. Five steps are a small part of any epoch (tiny preset: 40 steps).
NONFINITE_PATIENCE = 5


class NonFiniteSteps(Exception):
    """``NONFINITE_PATIENCE`` steps in a row were non-finite (raised inside the step that made the count).

    Attributes:
        reason: what the last of them held, in words (``loss nan``, ``gradients inf``, ...).
        in_a_row: the number of skipped steps in a row.
        epoch, step: where (the epoch, and the training pass within it), set by the trainer; 0 when unknown.
        first: where the last step first went non-finite (``trace_nonfinite``), set by the trainer; '' unknown.
    """

    def __init__(self, reason: str, in_a_row: int) -> None:
        self.reason, self.in_a_row = reason, int(in_a_row)
        self.epoch = self.step = 0
        self.first = ""
        super().__init__(f"{reason} in {in_a_row} steps in a row")


def _value_word(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


class StepGuard:
    """Decides, after a step's backward pass, whether the step may reach the weights.

    Args:
        model: the network (its parameters' gradients are checked, its buffers kept).
        agree: the largest of a number over all ranks (``autotune.trainer.ddp.all_ranks_max`` for one
            value); None when alone. Called once per step, so every rank must step together.
        patience: skipped steps in a row before ``NonFiniteSteps`` is raised.
    """

    def __init__(self, model: torch.nn.Module, agree: Callable[[int], int] | None = None,
                 patience: int = NONFINITE_PATIENCE) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = list(model.buffers())  # BatchNorm's running statistics and its batch count
        self.saved = [b.detach().clone() for b in self.buffers]
        self.agree = agree
        self.patience = int(patience)
        self.in_a_row = 0  # skipped steps since the last applied one
        self.skipped = 0  # skipped steps in all
        self.applied = True  # whether the last step was applied
        self.reason = ""  # what the last skipped step held

    def before_forward(self) -> None:
        """Keep the buffers the forward pass may change (one fused copy; nothing when there are none)."""
        if self.buffers:
            import torch

            torch._foreach_copy_(self.saved, self.buffers)

    def _local_reason(self, loss: torch.Tensor, scaler: Any) -> str:
        """What is non-finite on this rank ('' when nothing): the loss, or (no scaler) the gradients."""
        import torch

        grads = [p.grad for p in self.params if p.grad is not None] if scaler is None else []
        # the largest |gradient| is finite exactly when every gradient is (a NaN or Inf makes it NaN or Inf)
        worst = torch.nn.utils.get_total_norm(grads, norm_type=math.inf) if grads else None
        values = torch.stack([loss.detach().float().reshape(()),
                              worst.float() if worst is not None else torch.zeros((), device=loss.device)]).cpu()
        loss_value, grad_value = (float(v) for v in values)
        if not math.isfinite(loss_value):
            return f"loss {_value_word(loss_value)}"
        if not math.isfinite(grad_value):
            return f"gradients {_value_word(grad_value)} (loss {loss_value:.4g})"
        return ""

    def permits(self, loss: torch.Tensor, scaler: Any = None) -> bool:
        """Whether the step may go on to the optimizer (after its backward pass). When not, its gradients
        are dropped and the buffers put back; after ``patience`` such steps in a row raises ``NonFiniteSteps``."""
        reason = self._local_reason(loss, scaler)
        bad = int(self.agree(int(bool(reason)))) if self.agree is not None else int(bool(reason))
        if not bad:
            self.in_a_row, self.applied = 0, True
            return True
        import torch

        for p in self.params:
            p.grad = None
        if self.buffers:
            torch._foreach_copy_(self.buffers, self.saved)
        self.applied, self.reason = False, reason or "another rank's loss or gradients were non-finite"
        self.in_a_row += 1
        self.skipped += 1
        if self.in_a_row >= self.patience:
            raise NonFiniteSteps(self.reason, self.in_a_row)
        return False


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters and floating-point buffers of ``model`` that hold a NaN or Inf."""
    import torch

    named = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if b.is_floating_point())]
    return [name for name, tensor in named if not bool(torch.isfinite(tensor.detach()).all())]


def _tensors(value: Any) -> list[Any]:
    """The tensors in a module's inputs or output (a tensor, or tuples, lists and dicts of them)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _nonfinite(value: Any) -> bool:
    return any(t.is_floating_point() and not bool(t.detach().isfinite().all()) for t in _tensors(value))


def trace_nonfinite(model: torch.nn.Module, loss_fn: Callable[..., Any], images: torch.Tensor, labels: torch.Tensor,
                    amp_dtype: Any = None) -> str:
    """Run one training pass of ``images`` again with a forward hook on every module and say where a NaN or
    Inf first appears: the input batch, a module's input or output in the forward pass (the innermost module
    first), the loss, or else the backward pass (the parameter nearest the output whose gradient broke; the
    backward pass has no module hooks, which in-place activations forbid). Weights, buffers and gradients are
    left as they were; '' when everything stayed finite."""
    from autotune.autocast import autocast

    found: list[str] = []
    names = {module: name or "the network" for name, module in model.named_modules()}

    def forward(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        what = "input" if _nonfinite(inputs) else "output" if _nonfinite(output) else ""
        if what and not found:
            found.append(f"the forward {what} of {names[module]} ({type(module).__name__})")

    handles = [m.register_forward_hook(forward) for m in model.modules()]
    saved = [b.detach().clone() for b in model.buffers()]
    grads = [p.grad for p in model.parameters()]
    try:
        if _nonfinite(images):
            return "the input batch"
        for p in model.parameters():
            p.grad = None
        with autocast(images.device.type, amp_dtype):  # as autotune.step.train_step runs it
            loss = loss_fn(model(images), labels)
        if found or _nonfinite(loss):
            return found[0] if found else "the loss"
        loss.backward()
        broken = [n for n, p in model.named_parameters() if p.grad is not None and _nonfinite(p.grad)]
        return f"the backward pass, at the gradient of {broken[-1]}" if broken else ""
    finally:
        for handle in handles:
            handle.remove()
        for buffer, value in zip(model.buffers(), saved, strict=True):
            buffer.data.copy_(value)
        for param, grad in zip(model.parameters(), grads, strict=True):
            param.grad = grad
