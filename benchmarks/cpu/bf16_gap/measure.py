"""How far DeepSpeed's bf16 mode (bf16 weights) moves one step's gradient from DDP's (fp32 weights under bf16
autocast), on one CPU process: the part of a ZeRO-against-DDP gradient gap that has nothing to do with ranks or
sharding. The same Llama-like model (seed 0) and batch, one backward each way; the relative L2 error over all
parameters and the three parameters with the largest relative error.

    python benchmarks/cpu/bf16_gap/measure.py --out benchmarks/cpu/bf16_gap/results.json
"""

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# The shapes of the two-rank gate's models (benchmarks/1xH200/two_ranks/model.json and the harness's 1.35b).
SHAPES = {"168m": dict(hidden_size=1024, num_hidden_layers=8, intermediate_size=2816, max_position_embeddings=2048),
          "1.35b": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5504, max_position_embeddings=4096)}


def gradient_gap(shape: str, seq: int, batch: int) -> dict:
    config = LlamaConfig(vocab_size=32000, num_attention_heads=16, num_key_value_heads=16, **SHAPES[shape])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, labels=ids).loss.backward()
    autocast = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.to(torch.bfloat16)
    model(input_ids=ids, labels=ids).loss.backward()
    diff_sq = ref_sq = 0.0
    per_parameter = []
    for name, p in model.named_parameters():
        diff, ref = (p.grad.float() - autocast[name]).norm().item(), autocast[name].norm().item()
        diff_sq, ref_sq = diff_sq + diff ** 2, ref_sq + ref ** 2
        per_parameter.append((diff / max(ref, 1e-12), name))
    return {"shape": shape, "seq": seq, "batch": batch, "relative_l2": (diff_sq / ref_sq) ** 0.5,
            "worst": sorted(per_parameter, reverse=True)[:3], "seconds": round(time.perf_counter() - started, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="168m,1.35b")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--out", default="results.json")
    args = p.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        rows.append(gradient_gap(shape, args.seq, args.batch))
        print(json.dumps(rows[-1]), flush=True)
        with open(args.out, "w") as f:
            json.dump({"command": f"python benchmarks/cpu/bf16_gap/measure.py --shapes {args.shapes} --seq {args.seq} "
                                  f"--batch {args.batch}", "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
