# The two-rank exactness gate's MoE rows on one GPU (gloo): a Qwen3-MoE from moe.json whose experts run transformers'
# eager path, so each rank runs the experts its tokens route to and hf_zero makes the MoE blocks ZeRO-3 leaves (each
# row's leaf_classes in results.json says which modules were leaves). Against DDP on the same data and weights.
# Usage: bash benchmarks/1xH200/two_ranks/gate_moe.sh MINUTES   (OUT: the output folder's parent)
python -m benchmarks.harness --out ${OUT:-outputs}/gate_moe --ranks-per-gpu 2 --exactness --model benchmarks/1xH200/two_ranks/moe.json --seq 512 --steps 8 --warmup 2 --setups ddp,zero3 --variant ddp_again=ddp:mbs=4 --variant ddp_bf16=ddp:mbs=4,weights=bf16 --variant z3_gc=zero3+gc:mbs=4 --variant z2=zero2:mbs=4 --setup-timeout 150 --max-minutes $1
