"""transformers names that moved between the supported releases, asked for under their newest spelling."""

import pytest

from hf_zero.compat import hf_api


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2))


def test_checkpointing_switched_on_through_the_installed_name(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert not hf_api.checkpointing_on(args) and hf_api.checkpointing_kwargs(args) is None
    hf_api.turn_on_checkpointing(args)
    hf_api.set_checkpointing_kwargs(args, {"use_reentrant": False})
    name = hf_api.checkpointing_arg_name(args)
    assert getattr(args, name) is True and getattr(args, f"{name}_kwargs") == {"use_reentrant": False}
    assert hf_api.checkpointing_on(args) and hf_api.checkpointing_kwargs(args) == {"use_reentrant": False}


def test_model_checkpointing_enabled_without_a_deprecated_call():
    # tests/deprecation_guard.py turns a deprecated call made from hf_zero into a failure here
    model = _tiny_llama()
    assert not hf_api.model_checkpointing_on(model)
    hf_api.enable_model_checkpointing(model, {"use_reentrant": False})
    assert hf_api.model_checkpointing_on(model)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)


def test_the_guard_fails_a_deprecated_call_made_from_hf_zero():
    """The guard itself: a FutureWarning raised in transformers where an hf_zero module called in fails."""
    import deprecation_guard

    namespace = {"__name__": "hf_zero.example"}
    exec("def call(model):\n    return model.is_gradient_checkpointing\n", namespace)
    model = _tiny_llama()
    if not hasattr(type(model), "is_activation_checkpointing"):
        pytest.skip("this transformers has no newer name: is_gradient_checkpointing is not deprecated here")
    with pytest.raises(deprecation_guard.HfZeroCallsDeprecatedApi, match="hf_zero.example .* deprecated transformers"):
        namespace["call"](model)
    with pytest.warns(FutureWarning):  # the same call from anywhere else only warns
        model.is_gradient_checkpointing


def test_rotation_keeps_the_newest_and_the_best(tmp_path):
    import os
    import time

    from transformers import Trainer, TrainingArguments

    for step in (1, 2, 3, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        stamp = time.time() - 100 + step * 10
        os.utime(tmp_path / f"checkpoint-{step}", (stamp, stamp))
    trainer = Trainer(model=_tiny_llama(), args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                                  report_to=[], save_total_limit=None))
    trainer.state.best_model_checkpoint = str(tmp_path / "checkpoint-1")
    hf_api.rotate_checkpoints(trainer, str(tmp_path), 2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")) == \
        ["checkpoint-1", "checkpoint-4"]
    assert trainer.args.save_total_limit is None  # lent to the Trainer's own method (older releases) and returned
