"""gpumem's per-step memory logging for Hugging Face ``transformers.Trainer``::

    from gpumem.hf import GpumemCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[GpumemCallback(writer=SummaryWriter())])

At the end of each optimizer step the callback logs the device's allocated and reserved bytes
and the cache's fragmentation (see :class:`gpumem.watch.StepLogger`, which it wraps) and
prints each of ``gpumem diagnose``'s findings the first time it holds. Importing this module
imports ``transformers``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from gpumem.watch import StepLogger, StepMemory

__all__ = ["GpumemCallback"]


class GpumemCallback(TrainerCallback):  # type: ignore[misc]
    """A ``TrainerCallback`` that runs a :class:`gpumem.watch.StepLogger` at each
    ``on_step_end``, numbering steps with the Trainer's ``state.global_step``; the keyword
    arguments are :class:`~gpumem.watch.StepLogger`'s (``logger``, ``writer``, ``log_fn``,
    ``device``, ``source``, ``every``, …)."""

    def __init__(self, **step_logger: Any) -> None:
        super().__init__()
        self.memory = StepLogger(**step_logger)
        """The wrapped logger; ``memory.last`` holds the last figures."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Logs this step's figures (called by the Trainer)."""
        self.memory.step(int(state.global_step))
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Flushes the TensorBoard writer, if any (called by the Trainer)."""
        self.memory.close()
        return control

    @property
    def last(self) -> StepMemory | None:
        """The last step's figures, or None before the first."""
        return self.memory.last
