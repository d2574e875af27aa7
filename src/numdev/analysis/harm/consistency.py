"""A harm study's runs checked against each other before anything is computed from them.

The checks are numdev.analysis.consistency's, shared with the flash-stability study (one home);
kept importable here for the harm analysis and its tests."""

from __future__ import annotations

from numdev.analysis.consistency import LEARNING_RATE, WORKLOAD_KEYS, check

__all__ = ["LEARNING_RATE", "WORKLOAD_KEYS", "check"]
