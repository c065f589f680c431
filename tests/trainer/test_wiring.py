"""How ZeroCallback finds its Trainer (hf_zero/trainer/wiring.py), and the Trainer's order that it relies on."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ExportableState

from hf_zero.trainer.wiring import trainer_calling, trainer_starting_train


class Probe(TrainerCallback, ExportableState):
    """Records what the wiring finds at each moment, and whether the Trainer had built its optimizer then."""

    def __init__(self):
        self.seen = []

    def on_init_end(self, args, state, control, **kwargs):
        self.seen.append(("init_end", trainer_calling(self), None))

    def state(self):
        trainer = trainer_starting_train(self)
        self.seen.append(("state", trainer, None if trainer is None else trainer.optimizer))
        return {"args": {}, "attributes": {}}

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.append(("train_begin", trainer_calling(self), None))


def _trainer(tmp_path, callbacks):
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, vocab_size=64, max_position_embeddings=32))
    ids = torch.randint(0, 64, (4, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to=[],
                             save_strategy="no", use_cpu=True)
    return Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)


def test_the_callback_finds_its_trainer_when_built_and_when_train_starts_before_the_optimizer(tmp_path):
    probe = Probe()
    trainer = _trainer(tmp_path, [probe])
    trainer.train()
    moments = [(moment, found is trainer, optimizer) for moment, found, optimizer in probe.seen]
    # Trainer.__init__ asks for state() too, outside train(): found as no moment to prepare
    assert moments[0] == ("state", False, None) and ("init_end", True, None) in moments
    # train() asks for state() before it builds the optimizer (and, under DeepSpeed, the engine): the only request
    # of the Trainer's that comes there; on_train_begin comes after
    first_state = moments.index(("state", True, None))
    assert first_state < [m[0] for m in moments].index("train_begin")


def test_a_callback_added_later_is_found_only_inside_train(tmp_path):
    trainer = _trainer(tmp_path, [])
    probe = Probe()
    trainer.add_callback(probe)
    probe.state()  # a state request outside train(): nothing to prepare
    assert probe.seen == [("state", None, None)]
    trainer.train()
    assert any(moment == "state" and found is trainer for moment, found, _ in probe.seen)


def test_a_callback_outside_the_trainers_list_or_outside_a_trainer_finds_none(tmp_path):
    trainer = _trainer(tmp_path, [])
    stranger = Probe()
    assert trainer_calling(stranger) is None
    trainer.train()  # a callback not in the list is never called, and a direct call finds no Trainer frame
    assert stranger.seen == [] and trainer_starting_train(stranger) is None
