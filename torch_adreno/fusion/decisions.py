"""Fusion decisions, each with the reason it was taken or refused."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """Whether ``producer`` was fused into ``consumer`` (inlined, or placed in its kernel), and why."""

    producer: str
    consumer: str
    fused: bool
    reason: str

    def __str__(self) -> str:
        verb = "fused" if self.fused else "cannot fuse"
        return f"{verb} {self.producer} into {self.consumer}: {self.reason}"
