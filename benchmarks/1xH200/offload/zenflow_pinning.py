"""Why ZenFlow (ZeRO-2, overlap_step) is slow on one H200: the host buffers it shares with its optimizer process.

ZenFlow starts its CPU optimizer in a separate process and calls ``share_memory_()`` on the fp32 master partition,
its two gradient buffers and the stale copy, which DeepSpeed allocated pinned. This script checks whether those
buffers are still pinned after the process starts, times ZenFlow's micro-steps as DeepSpeed leaves them
(``as-shipped``) and after registering the same buffers with ``cudaHostRegister`` (``re-pinned``), and profiles
one update cycle to split host-device copies by kind (pinned or pageable). 1.35B Llama, bf16, seq 1024, one GPU,
DeepSpeed's engine directly (no Trainer). Prints one JSON line.

    for mode in as-shipped re-pinned; do python zenflow_pinning.py $mode; done | grep "^{" > zenflow_pinning.jsonl
"""
import json
import os
import statistics
import sys
import time
import tempfile

import torch

for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29551", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
    os.environ.setdefault(key, value)
import deepspeed  # noqa: E402
import transformers  # noqa: E402

from hf_zero.model_configs import build_config, resolve_model  # noqa: E402
from benchmarks.harness.profile import load_trace, summarize  # noqa: E402



def main():  # ZenFlow spawns its optimizer process, which imports this file again: nothing may run on import
    mode = sys.argv[1]
    MICRO_BATCH, SEQ, WARMUP, TIMED = 32, 1024, 3, 4
    zenflow = {"topk_ratio": 0.05, "select_strategy": "step", "select_interval": 2, "update_interval": 2, "overlap_step": True}
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "gradient_clipping": 1.0, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
              "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                    "reduce_bucket_size": 500000000, "allgather_bucket_size": 500000000,
                                    "offload_optimizer": {"device": "cpu", "pin_memory": True}, "zenflow": zenflow}}
    deepspeed.init_distributed(dist_backend="nccl")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(build_config(resolve_model("1.35b")[1])).to(torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ids = torch.randint(0, model.config.vocab_size, (MICRO_BATCH, SEQ), device=engine.device)


    def micro_step():
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return loss


    def shared_buffers():
        """The host tensors ZenFlow's optimizer process shares: per fp32 partition, itself, its stale copy, two grad buffers."""
        found = []
        for group in engine.optimizer.optimizer.param_groups:
            partition = group["params"][0]
            found += [("master", partition.data), ("stale", partition.stale_param.data),
                      ("grad0", partition.overlap_grad[0].data), ("grad1", partition.overlap_grad[1].data)]
        return found


    for _ in range(WARMUP):  # the first steps start the optimizer process (and build the op on first use)
        micro_step()
    torch.cuda.synchronize()
    pinned_before = {name: tensor.is_pinned() for name, tensor in shared_buffers()}
    if mode == "re-pinned":
        cudart = torch.cuda.cudart()
        for name, tensor in shared_buffers():
            if not tensor.is_pinned():
                code = cudart.cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0)
                assert int(code) == 0, f"cudaHostRegister({name}) returned {code}"
    pinned_after = {name: tensor.is_pinned() for name, tensor in shared_buffers()}

    times = []
    for _ in range(TIMED):
        start = time.perf_counter()
        micro_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(zenflow["update_interval"]):  # one update cycle
            micro_step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        prof.export_chrome_trace(f"{folder}/trace.json")
        profile = summarize(load_trace(f"{folder}/trace.json"), steps=zenflow["update_interval"])
    median = statistics.median(times)
    print(json.dumps({
        "mode": mode, "micro_batch": MICRO_BATCH, "seq": SEQ, "update_interval": zenflow["update_interval"],
        "pinned_before": pinned_before, "pinned_after": pinned_after, "micro_step_s": times, "median_micro_step_s": median,
        "tokens_per_s": MICRO_BATCH * SEQ / median, "gpu_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "profile_per_micro_step": {key: profile[key] for key in ("step_ms", "compute_ms", "idle_ms", "memcpy_ms", "cpu_sync_ms", "copies")},
        "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__}}), flush=True)


if __name__ == "__main__":
    main()
