"""A function of the training step compiled as one graph where Dynamo can trace it whole, else in
pieces, as ``torch.compile`` runs it.

A model with a graph break (a branch on a tensor's value, a data-dependent size, a context manager
Dynamo does not know) cannot be one graph. ``torch.compile`` then compiles the pieces between the
breaks and runs the code between them on the host; so does a :class:`~torch_adreno.TrainingStep`:
:class:`CompiledFunction` first compiles ``fullgraph=True`` and, when Dynamo refuses that for a
graph break, compiles the function again without it, warning once in one line with the first
break's place and Dynamo's reason.

Invariants: a function in pieces is never replayed (the host code between its graphs, the branch
taken included, would not run again), which :attr:`CompiledFunction.pieces_reason` tells its
owner; the pieces are compiled with Dynamo's automatic dynamism, so that a Python float the host
code hands to the next piece (a value ``.item()`` read) becomes an input of that piece after its
first change rather than a recompilation per value. An error that is not a graph break (an op we
cannot lower) is raised as it is: the pieces would meet it too.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

_log = logging.getLogger("torch_adreno")

#: What Dynamo raises under ``fullgraph=True`` where the function cannot be one graph: a graph break
#: (Unsupported), or a guard on a data-dependent value it captured (UserError).
_GRAPH_BREAKS = (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError)


def graph_break_description(err: BaseException) -> str:
    """``file:line (Dynamo's reason)`` of a graph break error: the innermost frame of the user's code
    Dynamo names, and the first line of its message."""
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0].strip()
    # (Dynamo's hints and symbol lists: not the reason)
    reason = re.sub(r"Consider annotating your code using torch\._check\*\(\)\.\s*|\s*\((unhinted|Size-like symbols):[^)]*\)", "",
                    reason).strip()
    stack = getattr(err, "real_stack", None)
    frame = stack[-1] if stack else None
    if frame is None:
        frames = traceback.extract_tb(err.__traceback__)
        frame = frames[-1] if frames else None
    place = f"{frame.filename}:{frame.lineno}" if frame is not None else "an unknown place"
    return f"{place} ({reason})"


class LossInPieces(Exception):
    """The function met a graph break while Dynamo traced it, before any of it ran, and is now
    compiled in pieces: its caller runs the step again, as a step in pieces."""


class CompiledFunction:
    """``fn`` compiled for the device: one graph, else pieces (see the module docstring).
    ``what`` names it in the warning ("the loss"). ``restart_in_pieces``:
    on the call that meets the break, raise :class:`LossInPieces` instead of running the pieces
    (the caller must prepare the step for host code first); else run them at once. ``advice``:
    how to make it one graph again, where its owner knows a cause (added to the warning)."""

    def __init__(self, fn: Callable[..., Any], options: Mapping[str, Any], what: str,
                 restart_in_pieces: bool = False, advice: Callable[[], str | None] = lambda: None) -> None:
        self._fn = fn
        self._advice = advice
        self._restart = restart_in_pieces
        self._options = dict(options)
        self._what = what
        self._whole: Callable[..., Any] = torch.compile(fn, backend="adreno", options=self._options,
                                                        dynamic=False, fullgraph=True)
        self._pieces: Callable[..., Any] | None = None
        #: Why the function runs in pieces and is not replayed (None: one graph).
        self.pieces_reason: str | None = None

    def __call__(self, *args: Any) -> Any:
        if self._pieces is not None:
            return self._pieces(*args)
        try:
            return self._whole(*args)
        except _GRAPH_BREAKS as err:
            where = graph_break_description(err)
        advice = self._advice()
        self.pieces_reason = (f"{self._what} has a graph break at {where}: it runs in pieces, the code between them on "
                              "the host" + (f" ({advice})" if advice else ""))
        _log.warning("TrainingStep: %s, and is not replayed", self.pieces_reason)
        self._pieces = torch.compile(self._fn, backend="adreno", options=self._options)
        if self._restart:
            raise LossInPieces(self.pieces_reason)
        return self._pieces(*args)
