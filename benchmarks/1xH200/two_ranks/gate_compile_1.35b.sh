# The two-rank exactness gate's compile row at the 1.35B shape, on one GPU (gloo): ZeRO-3 with hf_zero's compile path
# (each decoder block compiled and made a leaf) against a DDP reference compiled the same way (Accelerate's regional
# compilation of the repeated blocks, bf16 weights), so compiled kernels' rounding is not counted as a ZeRO-3 effect.
# ddp_gc_again measures DDP-against-DDP noise at this shape; ddp_gc_bf16 is the eager bf16 reference.
# Usage: bash benchmarks/1xH200/two_ranks/gate_compile_1.35b.sh MINUTES   (OUT: the output folder's parent)
RC='args.torch_compile=true,env.ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true'
python -m benchmarks.harness --out ${OUT:-outputs}/gate_compile_1.35b --ranks-per-gpu 2 --exactness --model 1.35b --seq 1024 --steps 6 --warmup 1 --setup-timeout 180 --max-minutes $1 --setups ddp+gc --variant ddp_compile_gc_bf16=ddp+gc:weights=bf16,$RC --variant z3_compile_gc=zero3+gc:args.torch_compile=true --variant ddp_gc_bf16=ddp+gc:weights=bf16 --variant ddp_gc_again=ddp+gc
