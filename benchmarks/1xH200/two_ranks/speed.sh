# One H200, one rank: ZeRO-3 with and without decoder-layer leaves against DDP and FSDP, in one launch
L='zero_optimization.stage3_module_granularity_threshold=5e6'
python -m benchmarks.harness --out $OUT/speed --nproc 1 --model 1.35b --seq 1024 --steps 12 --warmup 4 --setup-timeout 150 --max-minutes $1 --setups ddp,fsdp,zero3,ddp+gc,fsdp+gc,zero3+gc --variant z3_leaves=zero3:$L --variant z3_leaves+gc=zero3+gc:$L --variant "z3_leaves_nofix=zero3:$L,callback.skip_checks=[\"leaf-release\"]"
