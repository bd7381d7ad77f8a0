"""The rooms' async port (``kube/aio.py``): each coroutine is the blocking call of the same name with the
same parameters, run off the event loop's thread, on the pool it was given."""

from __future__ import annotations

import asyncio
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor

from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import KubePort
from tests.unit.fake_kube import FakeKube

OWN = {"on", "run"}


def _calls() -> list[str]:
    return [n for n, f in inspect.getmembers(AsyncKube, inspect.iscoroutinefunction) if not n.startswith("_")]


def test_every_coroutine_has_the_blocking_calls_signature() -> None:
    names = [n for n in _calls() if n not in OWN]
    assert len(names) >= 20
    for name in names:
        blocking = getattr(KubePort, name, None)
        assert blocking is not None, f"AsyncKube.{name} is not a KubePort call"
        ours = inspect.signature(getattr(AsyncKube, name))
        theirs = inspect.signature(blocking)
        assert list(ours.parameters) == list(theirs.parameters), name
        for p in ours.parameters.values():
            assert p.default == theirs.parameters[p.name].default, f"{name}({p.name})"


def test_calls_run_on_the_ports_pool_and_return_its_answer() -> None:
    kube = FakeKube()
    kube.add_node("n1")
    seen: list[str] = []
    get_node = kube.get_node

    def recording(name: str) -> dict[str, object]:
        seen.append(threading.current_thread().name)
        return get_node(name)

    kube.get_node = recording  # type: ignore[method-assign]
    reconcile = ThreadPoolExecutor(1, thread_name_prefix="kube")
    drain = ThreadPoolExecutor(1, thread_name_prefix="drain")
    port = AsyncKube(kube, reconcile)

    async def body() -> None:
        assert (await port.get_node("n1"))["metadata"]["name"] == "n1"
        assert (await port.on(drain).get_node("n1"))["metadata"]["name"] == "n1"

    asyncio.run(body())
    reconcile.shutdown()
    drain.shutdown()
    assert [s.split("_")[0] for s in seen] == ["kube", "drain"]
