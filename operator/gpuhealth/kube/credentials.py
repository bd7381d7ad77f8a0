"""Where the operator, the agent and the plugin find their Kubernetes credentials: one chain.

Components that run in pods prefer the in-cluster service account; the plugin, like kubectl,
prefers the kubeconfig chain. An explicit ``--kubeconfig`` always wins. ``KUBECONFIG`` is read at
call time (the client library reads it once, at import) and, as kubectl allows, may name several
files separated by ``:``, merged in order. The operator's Kopf login is fed from the same chain
(controller/process/handlers.py), so both always talk to the same cluster as the same user.
"""

from __future__ import annotations

import os

from kubernetes import client, config

from gpuhealth.kube.deadline import bounded

DEFAULT_KUBECONFIG = "~/.kube/config"


def kubeconfig_paths(kubeconfig: str | None = None) -> list[str]:
    """The kubeconfig files to merge: ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``."""
    chain = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return [os.path.expanduser(p) for p in chain.split(os.pathsep) if p]


def load(
    kubeconfig: str | None = None, context: str | None = None, in_cluster_first: bool = True
) -> client.Configuration:
    """A client Configuration; raises ``config.ConfigException`` when no credentials are found."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=_merged(kubeconfig), context=context, client_configuration=cfg)
        return cfg
    paths = kubeconfig_paths()
    if in_cluster_first:
        try:
            config.load_incluster_config(client_configuration=cfg)
            return cfg
        except config.ConfigException:
            pass
    if any(os.path.exists(p) for p in paths):
        config.load_kube_config(config_file=_merged(None), context=context, client_configuration=cfg)
        return cfg
    if not in_cluster_first:
        config.load_incluster_config(client_configuration=cfg)
        return cfg
    raise config.ConfigException(f"no in-cluster service account and no kubeconfig at {os.pathsep.join(paths)}")


def _merged(kubeconfig: str | None) -> str:
    """The client's loader merges ``a:b`` lists itself; missing files in a list are skipped, as kubectl does."""
    paths = kubeconfig_paths(kubeconfig)
    existing = [p for p in paths if os.path.exists(p)] or paths
    return os.pathsep.join(existing)


def api_client(kubeconfig: str | None = None, pool_size: int = 32, user_agent: str | None = None) -> client.ApiClient:
    """The operator's and the agent's client: its pool sized for its threads, a deadline on every
    request (``deadline.py``), and the component's own User-Agent. The API server names a write's
    field manager after the User-Agent where the request sets none, so a Node's ``managedFields`` and
    the audit log say ``gpuhealth-operator``, not the client library's ``OpenAPI-Generator``, which
    every Python client shares."""
    cfg = load(kubeconfig)
    cfg.connection_pool_maxsize = pool_size
    api = client.ApiClient(cfg)
    if user_agent:
        api.user_agent = user_agent
    return bounded(api)
