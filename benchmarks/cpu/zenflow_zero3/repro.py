"""ZenFlow under ZeRO-3 (DeepSpeed 0.19.8): two ways it goes wrong, on one CPU process (gloo) or one GPU.

ZenFlow's stage-3 optimizer transposes every 2-D parameter in place when the engine starts
(`_initialize_zenflow_stage3_prologue`), and the fetch hooks transpose each gathered matrix back for forward and
backward. Two consequences:

- ``init``: a model built under ``deepspeed.zero.Init`` (what the HF Trainer does for any ZeRO-3 config) is
  already partitioned, each weight an empty 1-D tensor, so the prologue skips it, yet the hooks still transpose
  the gathered matrix: the embedding becomes (hidden, vocab) and the first forward indexes past it (IndexError on
  CPU, "device-side assert triggered" on a GPU).
- ``save``: a model the engine partitions itself trains, but ``save_16bit_model`` gathers the transposed
  partitions and writes every matrix transposed; square ones keep their shape, so nothing complains.
- ``save-plain``: the same save without the zenflow block, the control.

Prints one JSON line.

    for case in init save save-plain; do python repro.py $case; done | grep "^{" > results.jsonl
"""
import json
import os
import sys
import tempfile

import torch
import torch._dynamo  # noqa: F401  (imported before zero.Init patches torch.Tensor: CPU torch 2.13 needs this order)

for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
    os.environ.setdefault(key, value)
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
import transformers  # noqa: E402

case = sys.argv[1]
on_gpu = torch.cuda.is_available()
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": on_gpu},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "steps_per_print": 10**9,
          "zero_optimization": {"stage": 3, "overlap_comm": True,
                                "offload_optimizer": {"device": "cpu", "pin_memory": on_gpu},
                                "stage3_param_persistence_threshold": 0,
                                "stage3_gather_16bit_weights_on_model_save": True}}
if case != "save-plain":
    config["zero_optimization"]["zenflow"] = {"topk_ratio": 0.05, "select_strategy": "step", "select_interval": 2,
                                              "update_interval": 2, "overlap_step": True}
deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
shape = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
result = {"case": case, "deepspeed": deepspeed.__version__, "device": "cuda" if on_gpu else "cpu"}
if case == "init":
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = transformers.LlamaForCausalLM(shape)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ids = torch.randint(0, shape.vocab_size, (2, 16), device=engine.device)
    try:
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if on_gpu:
            torch.cuda.synchronize()
        result["forward"] = "ok"
    except Exception as error:  # the failure is the finding: record it
        result["forward"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
else:
    model = transformers.LlamaForCausalLM(shape)
    expected = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    with tempfile.TemporaryDirectory() as folder:
        engine.save_16bit_model(folder, "pytorch_model.bin")
        saved = torch.load(os.path.join(folder, "pytorch_model.bin"))
    dtype = next(iter(saved.values())).dtype
    wrong = [name for name, tensor in expected.items()
             if saved[name].shape != tensor.shape or not torch.equal(saved[name], tensor.to(dtype))]
    transposed = [name for name in wrong
                  if expected[name].dim() == 2 and torch.equal(saved[name], expected[name].to(dtype).t())]
    result.update(tensors=len(expected), differ=len(wrong), saved_transposed=len(transposed),
                  example=[f"{n}: saved {tuple(saved[n].shape)}, model {tuple(expected[n].shape)}" for n in wrong[:2]])
print(json.dumps(result), flush=True)
