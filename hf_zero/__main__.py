from hf_zero.cli import main

raise SystemExit(main())
