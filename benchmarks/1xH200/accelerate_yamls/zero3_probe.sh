# Accelerate's README loop (plain Accelerator) on one GPU under the zero3 preset with its leaf-module threshold at 0,
# and under the zero3 YAML with a DummyOptim (DeepSpeed's FusedAdam): which one learns.
#   REPO_ROOT=$PWD bash benchmarks/1xH200/accelerate_yamls/zero3_probe.sh
set -x
W=/tmp/z3w; mkdir -p $W; cd $W
python - <<'PY'
import json, os, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=4, vocab_size=4096)).save_pretrained("/tmp/z3w/model")
c = json.load(open(os.path.join(os.environ["REPO_ROOT"], "recipes/zero3.json")))
c["zero_optimization"]["stage3_module_granularity_threshold"] = 0
json.dump(c, open("/tmp/z3w/z3_leaf0.json", "w"))
PY
L=$REPO_ROOT/tests/workers/accelerate_readme_loop.py
export PYTHONPATH=$REPO_ROOT/tests:$PYTHONPATH
for v in leaf0 dummy; do
  if [ $v = leaf0 ]; then
    timeout 150 accelerate launch --use_deepspeed --deepspeed_config_file /tmp/z3w/z3_leaf0.json --num_processes 1 \
      --mixed_precision no $L --model /tmp/z3w/model --out /tmp/z3w/$v --plain > /tmp/z3w/$v.log 2>&1
  else
    (cd $REPO_ROOT && python -m hf_zero presets zero3 --accelerate-config /tmp/z3w/zero3.yaml)
    timeout 150 accelerate launch --config_file /tmp/z3w/zero3.yaml --num_processes 1 $L \
      --model /tmp/z3w/model --out /tmp/z3w/$v --optimizer dummy > /tmp/z3w/$v.log 2>&1
  fi
  echo "$v exit $?"
  python -c "import json; d=json.load(open('/tmp/z3w/$v/result.json')); print('$v', d['optimizer'], d['losses'])" \
    || tail -5 /tmp/z3w/$v.log
done
