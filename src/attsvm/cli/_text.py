"""Wording shared by the commands' output lines."""

from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the right number: ``count(1, "policy", "policies")`` is ``"1 policy"``,
    ``count(3, "budget")`` is ``"3 budgets"``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
