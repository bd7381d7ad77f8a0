"""How a room makes one blocking API call from the loop: one typed signature for all of them.

The rooms get the runtime's ``call`` (``runtime.Runtime.call``: the call runs on the kube thread
pool) and write ``await self.call(self.kube.patch_node, name, patch)``. Typed as ``Callable[...,
Awaitable[Any]]`` mypy checked neither the arguments nor the result of any of them; with this
protocol it checks both against the ``KubePort`` method passed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, TypeVarTuple, Unpack

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Call(Protocol):
    def __call__(self, fn: Callable[[Unpack[Ts]], T], /, *args: *Ts) -> Awaitable[T]: ...
