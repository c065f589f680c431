"""Everything that differs between the releases hf_zero supports, in one place.

- ``releases``: the supported floors (setup.cfg's install_requires), the tested windows, the
  installed versions (read from package metadata, importing nothing), and the check ``import hf_zero``
  runs;
- ``deepspeed_api``: the DeepSpeed releases each engine fix was read against, and the WARNING a run
  logs once when the installed DeepSpeed is outside one; the releases a bug was fixed in; what a release writes into
  a checkpoint or can convert; where the DeepSpeed internals hf_zero uses live;
- ``hf_api``: transformers, accelerate, torch and numpy names that moved or were renamed between releases;
- ``op_builds``: where DeepSpeed's compiled ops are cached (one folder per Python environment), and the line a first
  build prints.

The rest of the package asks these modules instead of testing versions or attributes itself
(tests/repo/test_compat_boundary.py fails on a comparison or probe anywhere else).
"""

from . import deepspeed_api, hf_api, op_builds, releases

__all__ = ["deepspeed_api", "hf_api", "op_builds", "releases"]
