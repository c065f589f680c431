# One GPU, one rank: ZeRO-3 with decoder-layer leaves (hf_zero's leaf-release on) against plain ZeRO-3, DDP and FSDP,
# with gradient checkpointing in one launch and without it in a second.
# Usage: bash benchmarks/1xH200/two_ranks/speed.sh MINUTES   (each launch; OUT: the output folders' parent)
L='zero_optimization.stage3_module_granularity_threshold=5e6'
COMMON="--nproc 1 --model 1.35b --seq 1024 --steps 12 --warmup 3 --setup-timeout 120 --max-minutes $1"
python -m benchmarks.harness --out ${OUT:-outputs}/speed_gc $COMMON --setups ddp+gc,fsdp+gc,zero3+gc --variant z3_leaves_gc=zero3+gc:$L
python -m benchmarks.harness --out ${OUT:-outputs}/speed $COMMON --setups ddp,fsdp,zero3 --variant z3_leaves=zero3:$L
