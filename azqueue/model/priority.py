"""Task priorities, highest first; ``normal`` is an alias of ``lowest``."""

from __future__ import annotations

from enum import StrEnum


class Priority(StrEnum):
    HIGHEST = "highest"
    VERY_HIGH = "very-high"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    VERY_LOW = "very-low"
    LOWEST = "lowest"

    @classmethod
    def from_definition(cls, value: str) -> Priority:
        return cls.LOWEST if value == "normal" else cls(value)

    @property
    def rank(self) -> int:
        """0 for highest ... 6 for lowest."""
        return ORDER.index(self)


ORDER: tuple[Priority, ...] = tuple(Priority)
