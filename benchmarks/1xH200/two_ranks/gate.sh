# The two-rank exactness gate on one GPU (gloo): every setup against DDP on the same data and weights. DDP rows run
# first (ddp_bf16: DDP with bf16 weights, the gradient reference of DeepSpeed's bf16 arithmetic), then the leaf rows;
# "tight" settings (T) release and re-gather every weight, as a model larger than the preset's limits does.
# Usage: bash benchmarks/1xH200/two_ranks/gate.sh MINUTES   (OUT: the output folder's parent)
T='zero_optimization.stage3_module_granularity_threshold=1.2e6,zero_optimization.stage3_param_persistence_threshold=0,zero_optimization.stage3_max_live_parameters=0,zero_optimization.stage3_max_reuse_distance=0'
NF='callback.skip_checks=["leaf-release"]'
RE='args.gradient_checkpointing_kwargs={"use_reentrant":true}'
python -m benchmarks.harness --out ${OUT:-outputs}/gate --ranks-per-gpu 2 --exactness --model benchmarks/1xH200/two_ranks/model.json --seq 512 --steps 8 --warmup 2 --setup-timeout 150 --max-minutes $1 --setups ddp,zero3 --variant ddp_again=ddp:mbs=4 --variant ddp_bf16=ddp:mbs=4,weights=bf16 --variant z3_leaves_nofix=zero3:$T,$NF --variant z3_leaves=zero3:$T --variant z3_leaves_gc_nofix=zero3+gc:mbs=4,$T,$NF --variant z3_leaves_gc=zero3+gc:mbs=4,$T --variant z3_gc_reentrant=zero3+gc:mbs=4,$RE --variant z3_leaves_gc_reentrant=zero3+gc:mbs=4,$T,$RE --variant z2=zero2:mbs=4 --variant z1=zero1:mbs=4 --variant z3_compile=zero3:args.torch_compile=true --variant z3_offload=zero3_offload:mbs=4 --variant z2_offload=zero2_offload:mbs=4 --variant ddp_lora=ddp:lora.r=8 --variant z3_lora=zero3:lora.r=8
