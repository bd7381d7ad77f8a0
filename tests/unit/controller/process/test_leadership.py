"""Leadership through the runtime's lead loop: a replica acts only once held and primed, resyncs
after a pause (never after start-up), and a pause during the resync asks for another one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuhealth.controller.process.leadership import Leadership
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at
from tests.unit.fake_kube import FakeKube


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_state_alone_never_calls_anything() -> None:
    async def body() -> None:
        lead = Leadership()
        lead.hold()
        assert not lead.active.is_set()  # holding is not acting yet
        lead.loaded()
        assert await lead.wanted() is False  # the first activation after start-up: no resync
        assert lead.act() and lead.active.is_set()
        lead.release()
        assert not lead.active.is_set() and lead.resync_needed
        assert not lead.act()  # released: no acting
        lead.hold()
        assert await lead.wanted() is True  # after a pause: resync first
        lead.release()
        lead.hold()  # paused and held again during that resync
        assert not lead.act()  # the records may be stale again
        assert await lead.wanted() is True
        assert lead.act()

    asyncio.run(body())


def _runtime(resyncs: list[int], during: Callable[[], None] | None = None) -> Runtime:
    rt = Runtime(FakeKube(), clock=lambda: at(0), workers=1)

    async def resync() -> None:
        resyncs.append(1)
        if during is not None and len(resyncs) == 1:
            during()
        await asyncio.sleep(0)

    rt._resync = resync  # type: ignore[method-assign]
    return rt


def test_the_runtime_acts_after_the_start_up_list_and_resyncs_only_after_a_pause() -> None:
    async def body() -> None:
        resyncs: list[int] = []
        rt = _runtime(resyncs)
        rt.hold()  # Kopf's acting daemon can start before the start-up list is in
        await settle()
        assert not rt.active.is_set()
        rt.leadership.loaded()
        await settle()
        assert rt.active.is_set() and resyncs == []
        rt.release()
        await settle()
        assert not rt.active.is_set()
        rt.hold()
        await settle()
        assert rt.active.is_set() and resyncs == [1]
        await rt.stop()

    asyncio.run(body())


def test_a_pause_during_the_resync_asks_for_another_before_acting() -> None:
    async def body() -> None:
        resyncs: list[int] = []
        box: list[Runtime] = []

        def pause_and_resume() -> None:
            box[0].release()
            box[0].hold()

        rt = _runtime(resyncs, during=pause_and_resume)
        box.append(rt)
        rt.leadership.loaded()
        rt.hold()
        await settle()
        rt.release()
        rt.hold()
        await settle()
        assert rt.active.is_set() and len(resyncs) == 2
        await rt.stop()

    asyncio.run(body())
