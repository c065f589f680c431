"""The releases hf_zero's tests last passed on, and the last failing run of the newest releases: written by
.ci/record_tested.py (make lock, make test-newest), not by hand. hf-zero check and docs/versions.md read it."""

NEWEST_TESTED = {
    "torch": "2.15.0",
    "transformers": "5.25.0",
    "accelerate": "1.16.0",
    "deepspeed": "0.19.8",
    "safetensors": "0.8.0",
    "peft": "0.22.0",
    "trl": "1.16.0",
    "datasets": "5.2.0",
    "evaluate": "0.4.6"
}

# The last make test-newest whose tests failed, while no later run passed: its date, the releases it ran
# that are newer than NEWEST_TESTED, and the failing tests; None when the last run passed.
NEWEST_FAILING = None
