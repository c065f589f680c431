"""Smallest reproduction: ZeRO-3 leaf modules train differently from DDP on several ranks on a GPU (DeepSpeed alone).

Each case trains the same Llama-like model (built from a config, bf16) for a few AdamW steps on data it can memorize
(a small pool of random sequences, different samples per rank), and records:

- the first step's gradient of every parameter, after backward and before the step (``safe_get_full_grad``), compared
  with the first case's (the reference: the first case run, or the one ``--reference`` holds) as a relative L2 error;
- each step's loss, averaged over the ranks.

A case is ``ddp`` or a list of ZeRO-3 options joined by ``+`` (``zero3`` alone is the recipes/zero3.json preset as
shipped, with its "auto" values filled):

- ``leaves``: the decoder layers are ZeRO-3 leaves (``deepspeed.utils.set_z3_leaf_modules``);
- ``threshold``: ``stage3_module_granularity_threshold`` 1, a value below every module's granularity: no module
  becomes a leaf through it, but any threshold above 0 switches the parameter coordinator to its "fast sharding" of
  leaf modules, the path a threshold that does pick the decoder layers takes;
- ``fix``: after ``deepspeed.initialize``, ``fast_sharding_for_leaf_module`` is set back to False on the coordinator;
- ``tight``: persistence threshold, max live parameters and max reuse distance 0, so every weight is released and
  fetched again (the preset keeps a small model's weights gathered between forward and backward);
- ``no_overlap``: ``overlap_comm`` false (fetches and reductions on the compute stream);
- ``no_prefetch``: ``stage3_prefetch_bucket_size`` 0;
- ``torch_linear``: torch's own ``F.linear`` instead of the memory-efficient linear that zero.Init installs;
- ``gc`` / ``gcr``: non-reentrant / reentrant activation checkpointing (``use_cache`` off).

``gc`` and ``gcr`` also apply to ``ddp`` (``ddp+gc``). Ranks share the GPUs when there are more ranks than GPUs;
NCCL refuses two ranks on one device, so those runs use gloo (on CUDA tensors), as do CPU-only runs:

    torchrun --nproc_per_node 2 benchmarks/1xH200/two_ranks/leaf_repro.py --out leaf_repro.json \\
        --cases ddp,ddp,zero3,zero3+leaves,zero3+leaves+threshold,zero3+leaves+threshold+fix

A large model does not free all its GPU memory between cases in one process: run one case per launch, with
``--reference FILE --append`` (the first launch writes the reference gradients, the others compare with them).
"""

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

OPTIONS = {"leaves", "threshold", "fix", "tight", "no_overlap", "no_prefetch", "torch_linear", "gc", "gcr"}
MODEL = dict(hidden_size=1024, num_hidden_layers=8, intermediate_size=2816, vocab_size=32000, num_attention_heads=16,
             num_key_value_heads=16, max_position_embeddings=2048)
SIZES = {  # --size: the default above (168M), the harness's 1.35B model, and a tiny one to check the script on CPU
    "168m": {},
    "1.35b": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5504, max_position_embeddings=4096),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=256, num_attention_heads=4,
                 num_key_value_heads=4),
}
ORIGINAL_LINEAR = torch.nn.functional.linear


def parse_case(case: str) -> tuple[str, set]:
    kind, *options = case.split("+")
    unknown = set(options) - OPTIONS
    if kind not in ("ddp", "zero3") or unknown:
        raise SystemExit(f"unknown case {case!r}: ddp or zero3, then options from {sorted(OPTIONS)} joined by +")
    return kind, set(options)


def device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())


def start_process_group() -> str:
    import deepspeed

    world = int(os.environ["WORLD_SIZE"])
    shared = torch.cuda.is_available() and world > torch.cuda.device_count()
    backend = "nccl" if torch.cuda.is_available() and not shared else "gloo"
    if shared:  # DeepSpeed's engine picks its device from LOCAL_RANK: give each rank the index of the GPU it shares
        os.environ["LOCAL_RANK"] = str(device().index)
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    deepspeed.init_distributed(dist_backend=backend)
    return backend


def zero3_config(options: set, micro_batch: int) -> dict:
    preset = Path(__file__).resolve().parents[3] / "recipes" / "zero3.json"
    config = json.loads(preset.read_text())
    zero = config["zero_optimization"]
    config.update(bf16={"enabled": True}, fp16={"enabled": False}, gradient_accumulation_steps=1,
                  gradient_clipping=1.0, train_micro_batch_size_per_gpu=micro_batch)
    config.pop("train_batch_size")
    if "threshold" in options:
        zero["stage3_module_granularity_threshold"] = 1
    if "tight" in options:
        zero.update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0, stage3_max_reuse_distance=0)
    if "no_overlap" in options:
        zero["overlap_comm"] = False
    if "no_prefetch" in options:
        zero["stage3_prefetch_bucket_size"] = 0
    return config


_initial_weights = {}


def initial_weights(model_config) -> dict:
    """The weights every case starts from: one model initialized on the CPU with seed 0 (zero.Init draws its random
    initialization in another order, so each case loads these instead)."""
    from transformers import LlamaForCausalLM

    if not _initial_weights:
        torch.manual_seed(0)
        _initial_weights.update(LlamaForCausalLM(model_config).state_dict())
    return _initial_weights


def build_model(kind: str, options: set, config: dict | None):
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    model_config = LlamaConfig(**MODEL)
    model_config._attn_implementation = "sdpa"
    weights = initial_weights(model_config)
    if kind == "ddp":
        with torch.device(device()):
            model = LlamaForCausalLM(model_config)
        model.load_state_dict(weights)
    else:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = LlamaForCausalLM(model_config)
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            if dist.get_rank() == 0:
                for name, param in model.named_parameters():
                    param.data.copy_(weights[name])
        if "torch_linear" in options:
            torch.nn.functional.linear = ORIGINAL_LINEAR
        if "leaves" in options:
            deepspeed.utils.set_z3_leaf_modules(model, [type(model.model.layers[0])])
    if options & {"gc", "gcr"}:
        model.config.use_cache = False
        model.gradient_checkpointing_enable({"use_reentrant": "gcr" in options})
    return model


def batches(vocab: int, seq: int, micro_batch: int, steps: int, pool: int = 16):
    """This rank's micro-batches: every rank and step takes other samples of one small pool, which cycles."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = torch.randint(0, vocab, (pool, seq), generator=torch.Generator().manual_seed(0))
    for step in range(steps):
        first = (step * world + rank) * micro_batch
        yield ids[[(first + i) % pool for i in range(micro_batch)]].to(device())


def train(case: str, args) -> dict:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    kind, options = parse_case(case)
    config = zero3_config(options, args.micro_batch) if kind == "zero3" else None
    model = build_model(kind, options, config)
    if kind == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device()] if device().type == "cuda" else None)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        engine = None
    else:
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=args.lr),
                                          config=config)
        coordinator = engine.optimizer.parameter_offload.get_param_coordinator()
        fast = coordinator.fast_sharding_for_leaf_module
        if "fix" in options:
            coordinator.fast_sharding_for_leaf_module = False
    losses, grads, started = [], None, time.perf_counter()
    for step, ids in enumerate(batches(MODEL["vocab_size"], args.seq, args.micro_batch, args.steps)):
        if engine is None:
            with torch.autocast(device().type, dtype=torch.bfloat16):
                loss = ddp(input_ids=ids, labels=ids).loss
            loss.backward()
        else:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
        if step == 0:  # every rank takes part: ZeRO-3's full gradient is gathered from the partitions
            grads = {name: safe_get_full_grad(p).float().cpu() for name, p in
                     (engine.module if engine else model).named_parameters()}
        if engine is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            engine.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    seconds = time.perf_counter() - started
    row = {"case": case, "losses": losses, "seconds": seconds}
    if engine is not None:
        row["fast_sharding"] = fast
        row["leaves"] = sum(deepspeed.utils.z3_leaf_module(m) for m in engine.module.modules())
        engine.destroy()
    del model, engine
    gc.collect()
    torch.nn.functional.linear = ORIGINAL_LINEAR
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row, grads


def relative_error(grads: dict, reference: dict) -> tuple[float, str, float]:
    """Relative L2 error over all parameters, and the parameter with the largest relative error."""
    num = den = 0.0
    worst, worst_error = "", 0.0
    for name, ref in reference.items():
        diff = (grads[name] - ref).norm().item() ** 2
        num, den = num + diff, den + ref.norm().item() ** 2
        error = diff ** 0.5 / max(ref.norm().item(), 1e-12)
        if error > worst_error:
            worst, worst_error = name, error
    return (num / den) ** 0.5, worst, worst_error


def write(args, backend: str, rows: list) -> None:
    """The rows so far, with the command and versions (written after every case: a run cut short keeps them; with
    --append, each launch's command stays in its rows)."""
    import deepspeed
    import transformers

    command = ("torchrun --nproc_per_node %s benchmarks/1xH200/two_ranks/leaf_repro.py --size %s --cases %s --steps %d "
               "--seq %d --micro-batch %d --lr %g" % (os.environ["WORLD_SIZE"], args.size, args.cases, args.steps,
                                                     args.seq, args.micro_batch, args.lr))
    for row in rows:
        row.setdefault("command", command)
    result = {"command": command, "backend": backend, "world_size": dist.get_world_size(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                           "transformers": transformers.__version__},
              "model": MODEL, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="ddp,ddp,zero3,zero3+leaves,zero3+leaves+threshold,zero3+leaves+threshold+fix")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--out", default="leaf_repro.json")
    p.add_argument("--reference", help="a file for the first case's gradients: written when missing, else every "
                   "case is compared with the gradients it holds (one launch per case frees all memory between cases)")
    p.add_argument("--append", action="store_true", help="add the rows to those OUT already holds")
    p.add_argument("--size", choices=sorted(SIZES), default="168m", help="the model (tiny: to check the script on CPU)")
    args = p.parse_args()
    MODEL.update(SIZES[args.size])
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        parse_case(case)
    backend = start_process_group()
    rows = json.loads(Path(args.out).read_text())["rows"] if args.append and Path(args.out).exists() else []
    reference = torch.load(args.reference) if args.reference and Path(args.reference).exists() else None
    for case in cases:
        row, grads = train(case, args)
        if reference is None:
            reference = {"case": case, "grads": grads}
            if args.reference and dist.get_rank() == 0:
                torch.save(reference, args.reference)
        row["reference"] = reference["case"]
        row["grad_error"], row["worst_param"], row["worst_error"] = relative_error(grads, reference["grads"])
        rows.append(row)
        if dist.get_rank() == 0:
            write(args, backend, rows)
            print(f"leaf_repro: {case}: grad error {row['grad_error']:.3g} against {row['reference']} (worst "
                  f"{row['worst_param']} {row['worst_error']:.3g}), losses {' '.join(f'{x:.4f}' for x in row['losses'])}, "
                  f"{row['seconds']:.1f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
