"""Operator tools over the backbone: Kafka ACLs derived from the topic contract, the AsyncAPI document,
and the ``agentstream top`` dashboard. The application layer: the backbone and the services never import
these."""
