"""``agentstream deploy``: Kubernetes manifests for the consumer services, from deploy values.

``values.py`` merges the shipped defaults (``infra/deploy/values.yaml``) with the user's; ``manifests.py``
builds the objects (``gateway.py`` the gateway's; with ``security.enabled``, ``credentials.py`` each pod's
principal, login and Secrets and the setup Jobs, ``cells.py`` the tenants' cells, ``setup.py`` what the
setup Job runs); ``render.py`` writes them as one YAML stream or as a kustomize base; ``podman.py`` plays
them on one host. docs/deploy.md.
"""
