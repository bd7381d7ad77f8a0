"""Where the operator, the agent and the plugin find their Kubernetes credentials.

Components that run in pods prefer the in-cluster service account; the plugin, like kubectl,
prefers the kubeconfig chain. An explicit ``--kubeconfig`` always wins. KUBECONFIG is read at call
time (the client library reads it once, at import).
"""

from __future__ import annotations

import os

from kubernetes import client, config


def load(
    kubeconfig: str | None = None, context: str | None = None, in_cluster_first: bool = True
) -> client.Configuration:
    """A client Configuration; raises ``config.ConfigException`` when no credentials are found."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        return cfg
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if in_cluster_first:
        try:
            config.load_incluster_config(client_configuration=cfg)
            return cfg
        except config.ConfigException:
            pass
    if os.path.exists(path):
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        return cfg
    if not in_cluster_first:
        config.load_incluster_config(client_configuration=cfg)
        return cfg
    raise config.ConfigException(f"no in-cluster service account and no kubeconfig at {path}")


def api_client(kubeconfig: str | None = None, pool_size: int = 32) -> client.ApiClient:
    cfg = load(kubeconfig)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)
