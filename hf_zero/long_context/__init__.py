"""Long sequences on one GPU: hf_zero.enable_long_context and ZeroCallback(long_context=...)."""

from .switch import LongContext, causal_lm, decoder_layers, enable_long_context, long_context_of, long_context_problems

__all__ = ["LongContext", "causal_lm", "decoder_layers", "enable_long_context", "long_context_of",
           "long_context_problems"]
