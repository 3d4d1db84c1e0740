"""Task priorities, highest first; ``normal`` is an alias of ``lowest``."""

from __future__ import annotations

from enum import StrEnum

NORMAL = "normal"  # in a task definition: lowest


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
        return cls.LOWEST if value == NORMAL else cls(value)

    @property
    def rank(self) -> int:
        """0 for highest ... 6 for lowest."""
        return ORDER.index(self)


ORDER: tuple[Priority, ...] = tuple(Priority)

IN_DEFINITION: tuple[str, ...] = (*(p.value for p in ORDER), NORMAL)
"""What a task definition's ``priority`` may say."""
