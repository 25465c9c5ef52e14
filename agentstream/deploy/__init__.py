"""``agentstream deploy``: Kubernetes manifests for the consumer services, from deploy values.

``values.py`` merges the shipped defaults (``infra/deploy/values.yaml``) with the user's; ``manifests.py``
builds the objects; ``render.py`` writes them as one YAML stream or as a kustomize base. docs/deploy.md.
"""
