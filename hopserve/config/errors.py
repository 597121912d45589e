"""The one exception type raised for a bad configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file, environment override or path is invalid.

    Args:
        problems: One line per problem, each naming its source (file or environment
            variable), the key path and the bad value.
    """

    def __init__(self, problems: str | list[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))
