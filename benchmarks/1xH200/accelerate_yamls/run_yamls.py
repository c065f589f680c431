"""Accelerate's README loop under every preset's Accelerate YAML and every stored launch-only YAML on one GPU,
launched from a directory other than the checkout: with a plain ``accelerate.Accelerator()`` (no hf_zero line) and
with ``hf_zero.accelerator()``.

    python benchmarks/1xH200/accelerate_yamls/run_yamls.py --out OUT

Each run is ``accelerate launch --config_file NAME.yaml --num_processes 1`` (a preset's YAML as ``hf-zero presets NAME
--accelerate-config NAME.yaml`` writes it, or recipes/accelerate/NAME.yaml for zero3_multinode and zero3_sp) around
tests/workers/accelerate_readme_loop.py (torch AdamW, 4 steps, Accelerate's get_state_dict + save_pretrained), on a
random 4-layer Llama (hidden 512). Afterwards every tensor ``from_pretrained`` reloads is compared bit for bit with
the engine's gathered weights. zero3_nvme's YAML is written with ``--nvme-path``; zero3_sp needs
2 GPUs (sp_size 2) and zero3_multinode runs as one machine of one process. Writes OUT/results.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LOOP = REPO / "tests" / "workers" / "accelerate_readme_loop.py"
COMMAND = "python benchmarks/1xH200/accelerate_yamls/run_yamls.py --out OUT"


def tiny_llama(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                                 num_key_value_heads=4, vocab_size=4096)).save_pretrained(folder)


def bitwise_differences(out: Path) -> list:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    expected = load_file(str(out / "expected.safetensors"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(out / "final"), dtype="auto").state_dict()
    return [name for name, tensor in expected.items()
            if name not in reloaded or reloaded[name].dtype != tensor.dtype or not torch.equal(reloaded[name], tensor)]


def write_yamls(work: Path, nvme: Path) -> dict:
    """Name -> the YAML to launch: each preset's as hf-zero presets writes it into ``work`` (zero3_nvme's with ``nvme``
    inline), then the stored launch-only ones."""
    from hf_zero.config.presets import accelerate_config_path, launch_config_names, preset_names

    order = ["zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_nvme", "zero3_multinode", "zero3_sp"]
    yamls = {}
    for name in sorted(preset_names(), key=lambda n: (order + [n]).index(n)):
        yamls[name] = work / f"{name}.yaml"
        nvme_flag = ["--nvme-path", str(nvme)] if name == "zero3_nvme" else []
        subprocess.run([sys.executable, "-m", "hf_zero", "presets", name, *nvme_flag, "--accelerate-config",
                        str(yamls[name])], check=True, cwd=work)
    return yamls | {name: accelerate_config_path(name) for name in launch_config_names()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=int, default=240, help="seconds for one launch")
    opts = p.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())  # the launches run here: no recipes/ folder beside them
    model = work / "model"
    tiny_llama(model)
    nvme = work / "nvme"
    nvme.mkdir()
    print("model written", flush=True)
    yamls = write_yamls(work, nvme)
    print("yamls written", flush=True)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{os.environ.get('PYTHONPATH', '')}"}
    rows = []
    for name, config in yamls.items():
        if name == "zero3_sp":
            rows.append({"yaml": name, "not_run": "sp_size 2 needs 2 processes, one per GPU; this machine has one"})
            continue
        for door in ("plain", "hf_zero"):
            run_out = work / f"{name}-{door}"
            cmd = ["accelerate", "launch", "--config_file", str(config), "--num_processes", "1", "--num_machines", "1",
                   "--machine_rank", "0", str(LOOP), "--model", str(model), "--out", str(run_out)]
            cmd += ["--plain"] if door == "plain" else []
            started = time.time()
            try:
                proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=opts.timeout)
            except subprocess.TimeoutExpired as e:
                row = {"yaml": name, "door": door, "exit": "timeout", "seconds": opts.timeout,
                       "stderr_tail": (e.stderr or b"")[-3000:].decode(errors="replace")
                       if isinstance(e.stderr, bytes) else (e.stderr or "")[-3000:]}
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            row = {"yaml": name, "door": door, "exit": proc.returncode, "seconds": round(time.time() - started, 1)}
            if proc.returncode == 0:
                result = json.loads((run_out / "result.json").read_text())
                row.update({k: result[k] for k in ("engine", "zero_stage", "optimizer", "losses", "dp_world_size")})
                row["reload_differs"] = bitwise_differences(run_out)
            else:
                row["stderr_tail"] = proc.stderr[-3000:]
            rows.append(row)
            print(json.dumps(row if proc.returncode else {k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
            (out / "results.json").write_text(json.dumps({"command": COMMAND, "rows": rows}, indent=1))
    (out / "results.json").write_text(json.dumps({"command": COMMAND, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
