# One GPU, one rank: ZeRO-3 with decoder-layer leaves (hf_zero's leaf-release fix on, and off) against plain ZeRO-3
# and DDP, in one launch. Usage: bash benchmarks/1xH200/two_ranks/speed.sh MINUTES
L='zero_optimization.stage3_module_granularity_threshold=5e6'
python -m benchmarks.harness --out ${OUT:-outputs}/speed --nproc 1 --model 1.35b --seq 1024 --steps 10 --warmup 3 --setup-timeout 120 --max-minutes $1 --setups ddp,zero3 --variant z3_leaves=zero3:$L --variant "z3_leaves_nofix=zero3:$L,callback.skip_checks=[\"leaf-release\"]"
