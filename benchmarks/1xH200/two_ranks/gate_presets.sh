# The two-rank exactness gate's preset rows on one GPU (gloo): ZeRO-1, ZeRO-2, ZeRO-3, both offload presets, LoRA under
# ZeRO-3, and ZeRO-3 with reentrant checkpointing (with and without decoder-layer leaves), each against DDP on the same
# data and weights. ddp_again measures DDP-against-DDP noise; ddp_bf16 (DDP with bf16 weights) is the gradient
# reference of DeepSpeed's bf16 arithmetic. The leaf rows of the same model are gate.sh's.
# Usage: bash benchmarks/1xH200/two_ranks/gate_presets.sh MINUTES   (OUT: the output folder's parent)
T='zero_optimization.stage3_module_granularity_threshold=1.2e6,zero_optimization.stage3_param_persistence_threshold=0,zero_optimization.stage3_max_live_parameters=0,zero_optimization.stage3_max_reuse_distance=0'
RE='args.gradient_checkpointing_kwargs={"use_reentrant":true}'
python -m benchmarks.harness --out ${OUT:-outputs}/gate_presets --ranks-per-gpu 2 --exactness --model benchmarks/1xH200/two_ranks/model.json --seq 512 --steps 8 --warmup 2 --setup-timeout 150 --max-minutes $1 --setups ddp,zero3 --variant ddp_again=ddp:mbs=4 --variant ddp_bf16=ddp:mbs=4,weights=bf16 --variant ddp_lora=ddp:lora.r=8 --variant z1=zero1:mbs=4 --variant z2=zero2:mbs=4 --variant z3_offload=zero3_offload:mbs=4 --variant z2_offload=zero2_offload:mbs=4 --variant z3_lora=zero3:lora.r=8 --variant z3_gc_reentrant=zero3+gc:mbs=4,$RE --variant z3_leaves_gc_reentrant=zero3+gc:mbs=4,$T,$RE
