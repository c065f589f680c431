"""Old module paths keep importing: ``import hf_zero.callback`` gives ``hf_zero.trainer.callback``, with a
DeprecationWarning naming the new path. Scripts written against the flat layout keep working."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "hf_zero.callback": "hf_zero.trainer.callback",
    "hf_zero.checkpoint": "hf_zero.checkpoints.folders",
    "hf_zero.compile": "hf_zero.trainer.compile",
    "hf_zero.environment": "hf_zero.config.environment",
    "hf_zero.export": "hf_zero.checkpoints.export",
    "hf_zero.loading": "hf_zero.zero3.loading",
    "hf_zero.memory": "hf_zero.trainer.memory",
    "hf_zero.padding": "hf_zero.trainer.padding",
    "hf_zero.presets": "hf_zero.config.presets",
    "hf_zero.resume": "hf_zero.checkpoints.resume",
    "hf_zero.rules": "hf_zero.config.rules",
    "hf_zero.safe_load": "hf_zero.checkpoints.safe_load",
    "hf_zero.saving": "hf_zero.zero3.gathering",
    "hf_zero.training_args": "hf_zero.trainer.training_args",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        target = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {target}; import it from there (or from hf_zero)",
                      DeprecationWarning, stacklevel=4)
        return importlib.import_module(target)

    def exec_module(self, module):
        pass  # the target module ran already


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
