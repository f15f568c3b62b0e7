"""What every check of the calibration suite counts of one trial: whether an interval holds
the truth, whether it detects a gap (excludes 0), and the coverage of several named
intervals at once."""

from __future__ import annotations


def covers(interval: dict, truth: float) -> bool:
    """Whether ``interval`` holds ``truth``."""
    return interval["low"] <= truth <= interval["high"]


def detects(interval: dict) -> bool:
    """Whether ``interval`` excludes 0."""
    return interval["low"] > 0 or interval["high"] < 0


class Coverage:
    """Of each named interval, the share of the trials that printed it (an interval with a
    lower end) whose interval holds the truth."""

    def __init__(self):
        self.hits: dict = {}
        self.counted: dict = {}

    def score(self, name: str, interval, value: float) -> None:
        if interval is None or interval["low"] is None:
            return
        self.counted[name] = self.counted.get(name, 0) + 1
        self.hits[name] = self.hits.get(name, 0) + covers(interval, value)

    def shares(self) -> dict:
        return {name: self.hits[name] / self.counted[name] for name in self.hits}
