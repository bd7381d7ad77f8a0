"""The controller's Kube port as coroutines: every API call a room makes, typed, on a thread pool.

The Kubernetes client blocks, and the controller runs on one asyncio loop. Each call here is a
method with the blocking port's signature that runs it on the pool and returns its result when
awaited, so a room holds one object for the API, and mypy strict checks every argument and result
(a generic "run this callable" would accept anything). The runtime builds one port per pool
(``controller/process/runtime.py``): reconcile calls, and drain steps on a pool of their own, so a
drain storm's evictions never queue in front of the next taint.

The watches take the blocking port (``sync``): they run in threads of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple, Unpack

from gpuhealth.kube.client import KubePort

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
Body = dict[str, Any]


class AsyncKube:
    def __init__(self, kube: KubePort, executor: Executor) -> None:
        self.sync = kube
        self._executor = executor

    def on(self, executor: Executor) -> AsyncKube:
        """The same port, its calls on other threads."""
        return AsyncKube(self.sync, executor)

    async def run(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Any other blocking call (a watch's list) on this port's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- Nodes -----------------------------------------------------------------------------------

    async def get_node(self, name: str) -> Body:
        return await self.run(self.sync.get_node, name)

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.patch_node, name, patch)

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.patch_node_status, name, patch)

    # -- pods ------------------------------------------------------------------------------------

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.patch_pod, namespace, name, patch)

    async def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
        await self.run(self.sync.evict_pod, namespace, name, uid, resource_version)

    async def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        await self.run(self.sync.force_delete_pod, namespace, name, uid)

    async def list_pods_on_node(self, node: str) -> list[Body]:
        return await self.run(self.sync.list_pods_on_node, node)

    # -- gpuhealth's own objects -----------------------------------------------------------------

    async def get_report(self, name: str) -> Body:
        return await self.run(self.sync.get_report, name)

    async def create_report(self, body: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.create_report, body)

    async def patch_report_status(self, name: str, patch: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.patch_report_status, name, patch)

    async def delete_report(self, name: str, uid: str | None) -> None:
        await self.run(self.sync.delete_report, name, uid)

    async def patch_policy_status(self, name: str, patch: Mapping[str, Any]) -> None:
        await self.run(self.sync.patch_policy_status, name, patch)

    # -- repair Jobs -----------------------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> Body:
        return await self.run(self.sync.get_job, namespace, name)

    async def create_job(self, namespace: str, body: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.create_job, namespace, body)

    async def delete_job(self, namespace: str, name: str) -> None:
        await self.run(self.sync.delete_job, namespace, name)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        await self.run(self.sync.delete_pod, namespace, name, uid)

    # -- DRA -------------------------------------------------------------------------------------

    async def list_resource_claims(self) -> list[Body]:
        return await self.run(self.sync.list_resource_claims)

    async def list_device_taint_rules(self) -> list[Body]:
        return await self.run(self.sync.list_device_taint_rules)

    async def create_device_taint_rule(self, body: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.create_device_taint_rule, body)

    async def delete_device_taint_rule(self, name: str, uid: str | None = None) -> None:
        await self.run(self.sync.delete_device_taint_rule, name, uid)

    # -- Kueue -----------------------------------------------------------------------------------

    async def kueue_served(self) -> bool:
        return await self.run(self.sync.kueue_served)

    async def kueue_allowed(self) -> bool:
        return await self.run(self.sync.kueue_allowed)

    async def apply_workload_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Body:
        return await self.run(self.sync.apply_workload_status, namespace, name, body)

    async def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> None:
        await self.run(self.sync.apply_admission_check_status, name, body)

    async def get_resource_flavor(self, name: str) -> Body:
        return await self.run(self.sync.get_resource_flavor, name)
