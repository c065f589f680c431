"""hf_zero.long_context on CPU: each part gives the loss and gradients of the plain model, and the checks fire
on models the parts cannot run (and stay quiet on those they can)."""

import copy
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_zero.errors import ConfigError
from hf_zero.long_context import LongContext, enable_long_context, long_context_of, long_context_problems

SEQ = 256  # 8 MLP shards at hidden 32: the tiled path runs, with a short last shard below


def _llama(attn="sdpa", **overrides):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, max_position_embeddings=SEQ, **overrides)
    config._attn_implementation = attn
    return LlamaForCausalLM(config)


def _batch(seq=SEQ - 5):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, seq), generator=generator)
    labels = ids.clone()
    labels[0, :40] = -100  # a prompt the loss ignores
    return ids, labels


def _loss_and_grads(model, ids, labels, checkpointing, reentrant=False):
    model.train()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    model.zero_grad()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


PARTS = {"all": LongContext(), "tiled_mlp": LongContext(True, False, False),
         "fused_loss": LongContext(False, True, False), "offload_activations": LongContext(False, False, True)}


@pytest.mark.parametrize("name", PARTS)
def test_each_part_keeps_the_loss_and_gradients(name):
    ids, labels = _batch()
    plain = _llama()
    tuned = copy.deepcopy(plain)
    loss, grads = _loss_and_grads(plain, ids, labels, checkpointing=False)
    enable_long_context(tuned, PARTS[name])
    assert long_context_of(tuned) == PARTS[name]
    tuned_loss, tuned_grads = _loss_and_grads(tuned, ids, labels, checkpointing=True)
    # fp32 on CPU: tiles change only the order of sums (measured differences ~1e-7)
    torch.testing.assert_close(tuned_loss, loss, rtol=1e-5, atol=1e-6)
    for key, grad in grads.items():
        torch.testing.assert_close(tuned_grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)


def _family(name):
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if name == "gpt2":
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=SEQ, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0)  # dropout would differ between the two runs
        cls = GPT2LMHeadModel
    else:
        config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=97, max_position_embeddings=SEQ)
        cls = Qwen2ForCausalLM
    config._attn_implementation = "sdpa"
    return cls(config)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_other_families_keep_the_loss_and_gradients(family):
    ids, labels = _batch()
    plain = _family(family)
    tuned = copy.deepcopy(plain)
    loss, grads = _loss_and_grads(plain, ids, labels, checkpointing=False)
    enable_long_context(tuned)
    tuned_loss, tuned_grads = _loss_and_grads(tuned, ids, labels, checkpointing=True)
    torch.testing.assert_close(tuned_loss, loss, rtol=1e-5, atol=1e-6)
    for key, grad in grads.items():
        torch.testing.assert_close(tuned_grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)


def test_the_trainers_token_count_gives_the_same_loss():
    """The Trainer passes num_items_in_batch (tokens over the whole accumulated batch); the fused loss divides
    by it as the model's own loss does."""
    ids, labels = _batch()
    plain = _llama()
    tuned = copy.deepcopy(plain)
    enable_long_context(tuned)
    plain.train(), tuned.train()
    expected = plain(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(1000)).loss
    out = tuned(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(1000))
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-7)
    assert getattr(out, "logits", None) is None  # the seq x vocab logits were never built


def test_evaluation_and_generation_keep_the_logits():
    ids, _ = _batch(16)
    plain = _llama()
    tuned = copy.deepcopy(plain)
    enable_long_context(tuned)
    plain.eval(), tuned.eval()
    with torch.no_grad():
        torch.testing.assert_close(tuned(input_ids=ids).logits, plain(input_ids=ids).logits)
    out = tuned.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)


def test_mlp_tiles_really_run(monkeypatch):
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    calls = []
    original = ulysses_sp.TiledMLP.forward
    monkeypatch.setattr(ulysses_sp.TiledMLP, "forward",
                        staticmethod(lambda ctx, fn, self, x, shards, params: calls.append(shards)
                                     or original(ctx, fn, self, x, shards, params)))
    model = _llama()
    enable_long_context(model, {"tiled_mlp": True, "fused_loss": False, "offload_activations": False})
    ids, labels = _batch()
    model.train()
    model(input_ids=ids, labels=labels).loss.backward()
    assert calls == [8, 8]  # ceil(251 / 32) shards, one call per layer


@pytest.mark.parametrize("reentrant", [False, True])
def test_layer_inputs_are_saved_through_the_offload_hook(monkeypatch, reentrant):
    """Under either kind of checkpointing each decoder layer's input passes the save_on_cpu pack hook."""
    packed = []
    original = torch.autograd.graph.save_on_cpu.__init__

    def counting(self, *args, **kwargs):
        original(self, *args, **kwargs)
        pack = self.pack_hook
        self.pack_hook = lambda t: packed.append(tuple(t.shape)) or pack(t)

    monkeypatch.setattr(torch.autograd.graph.save_on_cpu, "__init__", counting)
    model = _llama()
    enable_long_context(model, {"tiled_mlp": False, "fused_loss": False, "offload_activations": True})
    ids, labels = _batch()
    _loss_and_grads(model, ids, labels, checkpointing=True, reentrant=reentrant)
    assert packed.count((2, SEQ - 5, 32)) == 2  # one hidden-state input per checkpointed layer, nothing else


def test_eager_attention_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="attn_implementation='sdpa'"):
        enable_long_context(_llama(attn="eager"))
    assert long_context_of(_llama()) is None  # nothing was changed on the refused model either
    assert long_context_problems(_llama(), LongContext()) == []


def test_expert_mlps_are_refused_for_tiling_and_accepted_without_it():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=97, num_experts=4,
                            num_experts_per_tok=2)
    config._attn_implementation = "sdpa"
    model = Qwen3MoeForCausalLM(config)
    with pytest.raises(ConfigError, match="tiled_mlp.*False"):
        enable_long_context(model)
    assert enable_long_context(model, {"tiled_mlp": False}) == LongContext(tiled_mlp=False)


def test_fused_loss_without_trl_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl.trainer.utils", None)  # import fails as if TRL were absent
    with pytest.raises(ConfigError, match="pip install 'hf_zero\\[long\\]'"):
        enable_long_context(_llama())
    assert long_context_problems(_llama(), LongContext(fused_loss=False)) == []


def test_bad_options_get_one_message():
    with pytest.raises(ConfigError, match="unknown part.*tiled_attention"):
        LongContext.from_option({"tiled_attention": True})
    with pytest.raises(ConfigError, match="true, false, or a dict"):
        LongContext.from_option("yes")
    model = _llama()
    enable_long_context(model)
    assert enable_long_context(model, True) == LongContext()  # the same parts again: nothing to do
    with pytest.raises(ConfigError, match="already on"):
        enable_long_context(model, {"fused_loss": False})


def test_a_lora_model_keeps_its_adapter_gradients():
    from peft import LoraConfig, get_peft_model

    ids, labels = _batch()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
                        task_type="CAUSAL_LM", init_lora_weights=False)  # non-zero B: every adapter gets a gradient
    plain = get_peft_model(_llama(), config)
    tuned = copy.deepcopy(plain)
    loss, grads = _loss_and_grads(plain, ids, labels, checkpointing=False)
    enable_long_context(tuned)
    assert long_context_of(tuned) == LongContext()
    tuned_loss, tuned_grads = _loss_and_grads(tuned, ids, labels, checkpointing=True)
    torch.testing.assert_close(tuned_loss, loss, rtol=1e-5, atol=1e-6)
    trained = {k: g for k, g in grads.items() if g is not None}
    assert trained and all("lora_" in k for k in trained)
    for key, grad in trained.items():
        torch.testing.assert_close(tuned_grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)
