from hf_zero.finetune.train import main

raise SystemExit(main())
