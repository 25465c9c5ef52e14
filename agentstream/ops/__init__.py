"""Operator tools over the backbone: Kafka ACLs derived from the topic contract, the AsyncAPI document,
the ``agentstream top`` dashboard, and browsing and re-driving dead letters (``dlq``). The application
layer: the backbone and the services never import these."""
