"""Which weights a README-loop run under the zero3 preset changes, with the preset's leaf-module threshold (5e6) and
with it at 0, on one GPU: a Llama of hidden 1024 (decoder layers of 16M parameters, above the threshold; their
attention and MLP blocks below it), 4 steps of torch AdamW at lr 1e-3.

    python benchmarks/1xH200/accelerate_yamls/leaf_probe.py --out OUT [--mixed-precision bf16]  # OUT/leaf_probe_no.json
"""

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def main():
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    opts = p.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=8,
                                 num_key_value_heads=8, vocab_size=4096)).save_pretrained(work / "model")
    initial = load_file(str(work / "model" / "model.safetensors"))
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{os.environ.get('PYTHONPATH', '')}"}
    report = {"command": "python benchmarks/1xH200/accelerate_yamls/leaf_probe.py --out OUT --mixed-precision "
                          + opts.mixed_precision}
    for threshold in (5_000_000, 0):
        config = json.loads((REPO / "recipes" / "zero3.json").read_text())
        config["zero_optimization"]["stage3_module_granularity_threshold"] = threshold
        path = work / f"zero3_{threshold}.json"
        path.write_text(json.dumps(config))
        run = work / f"run_{threshold}"
        proc = subprocess.run(["accelerate", "launch", "--use_deepspeed", "--deepspeed_config_file", str(path),
                               "--num_processes", "1", "--mixed_precision", opts.mixed_precision,
                               str(REPO / "tests" / "workers" / "accelerate_readme_loop.py"), "--plain",
                               "--model", str(work / "model"), "--out", str(run)],
                              cwd=work, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode:
            report[str(threshold)] = {"exit": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
            continue
        final = load_file(str(run / "expected.safetensors"))
        unchanged = sorted(name for name, tensor in final.items() if torch.equal(tensor, initial[name]))
        report[str(threshold)] = {"losses": json.loads((run / "result.json").read_text())["losses"],
                                  "tensors": len(final), "unchanged": unchanged}
        print(threshold, report[str(threshold)]["losses"], len(unchanged), "of", len(final), "unchanged", flush=True)
    (out / f"leaf_probe_{opts.mixed_precision}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
