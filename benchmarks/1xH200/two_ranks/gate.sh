# The two-rank exactness gate's leaf rows on one GPU (gloo): ZeRO-3 with and without leaves, with and without
# hf_zero's leaf-release fix (the *_nofix rows skip it), against DDP on the same data and weights. DDP rows run first
# (ddp_again: DDP-against-DDP noise); "tight" settings (T) release and re-gather every weight, as a model larger than
# the preset's limits does. The presets' rows of the same model are gate_presets.sh's.
# Usage: bash benchmarks/1xH200/two_ranks/gate.sh MINUTES   (OUT: the output folder's parent)
T='zero_optimization.stage3_module_granularity_threshold=1.2e6,zero_optimization.stage3_param_persistence_threshold=0,zero_optimization.stage3_max_live_parameters=0,zero_optimization.stage3_max_reuse_distance=0'
NF='callback.skip_checks=["leaf-release"]'
python -m benchmarks.harness --out ${OUT:-outputs}/gate --ranks-per-gpu 2 --exactness --model benchmarks/1xH200/two_ranks/model.json --seq 512 --steps 8 --warmup 2 --setup-timeout 150 --max-minutes $1 --setups ddp,zero3 --variant ddp_again=ddp:mbs=4 --variant z3_leaves_nofix=zero3:$T,$NF --variant z3_leaves=zero3:$T --variant z3_leaves_gc_nofix=zero3+gc:mbs=4,$T,$NF --variant z3_leaves_gc=zero3+gc:mbs=4,$T
