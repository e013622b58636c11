"""Figures in place of the engine choice's timing (workers/engines/choice.py), so a unit
test decides what "faster" measured and checks what the choice does with it."""

from __future__ import annotations

from typing import Any

import pytest


def fake_timings(monkeypatch: pytest.MonkeyPatch, figures: dict[str, float]) -> list[tuple[str, ...]]:
    """Make ``time_alternating`` answer ``figures`` (seconds per candidate); the list it
    returns fills with the candidates of each timing asked for, in order."""
    from layerbank.workers.engines import choice

    calls: list[tuple[str, ...]] = []

    def fake(runs: dict[str, Any], rounds: int = 3) -> dict[str, float]:
        calls.append(tuple(runs))
        return {name: figures[name] for name in runs}

    monkeypatch.setattr(choice, "time_alternating", fake)
    return calls
