"""The newest release of each package that CI's newest-release environment ran its tests on, written by
`make test-newest` (python -m hf_zero.compat.record_tested) when they passed: not edited by hand."""

NEWEST_TESTED = {
    "torch": "2.15.0",
    "transformers": "5.25.0",
    "accelerate": "1.16.0",
    "deepspeed": "0.19.8",
    "safetensors": "0.8.0",
    "peft": "0.21.2",
    "trl": "1.16.0",
    "datasets": "5.2.0",
    "evaluate": "0.4.6"
}
