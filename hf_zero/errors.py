"""The one exception type hf_zero raises for configuration problems."""


class ConfigError(ValueError):
    """A DeepSpeed/Trainer configuration that would fail, or silently misbehave.

    Carries every problem found, each a line saying what is wrong and how to fix it,
    so a user fixes them all in one go instead of one per run.
    """

    def __init__(self, problems, *, source=None):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            message = head + self.problems[0]
        else:
            message = head + f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)
