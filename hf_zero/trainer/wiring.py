"""How ZeroCallback reaches its Trainer: the one place that knows.

A TrainerCallback's events bring the arguments, the state and the model, never the Trainer, yet ZeroCallback must
prepare the run before the Trainer builds the DeepSpeed engine (gradient checkpointing, the 16-bit save, zero.Init
checks) and later needs the engine itself. Two moments of the Trainer come before its engine:

- ``on_init_end``, at the end of ``Trainer.__init__``: where ``callbacks=[ZeroCallback()]`` (instance or class)
  prepares;
- the TrainerState that ``train()`` builds before the engine, for which the Trainer asks every stateful callback
  (``ExportableState``) for ``state()``: where a callback added later with ``add_callback`` prepares. No callback
  event runs between ``train()`` and the engine (``on_train_begin`` comes after ``accelerator.prepare``), so this
  request is the only one that serves; tests/trainer/test_wiring.py fails if a transformers release moves it.

At both, the Trainer is running one of its own methods, so it is the ``self`` of a frame a few levels up the call
stack; ``hf_zero.attach(trainer)`` needs none of this.
"""

import sys

from transformers import Trainer


def trainer_calling(callback):
    """The Trainer whose method is running now and holds ``callback`` in its callback list, else None."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        handler = getattr(candidate, "callback_handler", None) if isinstance(candidate, Trainer) else None
        if handler is not None and callback in handler.callbacks:
            return candidate
        frame = frame.f_back
    return None


def trainer_starting_train(callback):
    """The Trainer asking ``callback`` for its state inside ``train()``, else None (a TrainerState built outside
    training, e.g. by a user, is no moment to prepare). The first such request of a run comes before the engine."""
    trainer = trainer_calling(callback)
    return trainer if trainer is not None and getattr(trainer, "is_in_train", False) else None
