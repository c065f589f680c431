# The two-rank exactness gate at the 1.35B shape, on one GPU (gloo): ZeRO-3 with and without decoder-layer leaves and
# the compile path (ZeroCallback compiles each decoder block and makes it a leaf) against DDP, with gradient
# checkpointing (what fits two ranks on one 80 GB card). ddp_gc_bf16 is DDP with bf16 weights: the gradient reference
# of DeepSpeed's bf16 arithmetic. The fast leaf path without hf_zero's fix is z3_leaves_gc_nofix, after the others.
# Usage: bash benchmarks/1xH200/two_ranks/gate_1.35b.sh MINUTES   (OUT: the output folder's parent)
L='zero_optimization.stage3_module_granularity_threshold=5e6'
NF='callback.skip_checks=["leaf-release"]'
python -m benchmarks.harness --out ${OUT:-outputs}/gate_1.35b --ranks-per-gpu 2 --exactness --model 1.35b --seq 1024 --steps 6 --warmup 1 --setup-timeout 180 --max-minutes $1 --setups ddp+gc --variant ddp_gc_bf16=ddp+gc:weights=bf16 --variant zero3_gc=zero3+gc --variant z3_leaves_gc=zero3+gc:$L --variant z3_compile_gc=zero3+gc:args.torch_compile=true --variant z3_leaves_gc_nofix=zero3+gc:$L,$NF
