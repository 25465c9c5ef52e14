"""The HTTP gateway (``agentstream worker gateway``): runs, their events as Server-Sent Events, approvals and
sessions over HTTP, and an OpenAI-compatible chat completions endpoint, for clients without a Kafka client.

Stateless: any number of replicas behind a load balancer. It is a client of the pipeline like any other
(``AgentClient``, one per tenant's cell) plus one shared Kafka consumer per cell for the live streams.
docs/gateway.md has the design, the endpoints, auth and limits; the modules:

- ``app``: the FastAPI application; ``server``: uvicorn; ``settings``: ``AGENTSTREAM_GATEWAY_*``;
- ``routes_runs``: /v1/runs, /v1/approvals, /v1/sessions; ``routes_openai``: /v1/chat/completions, /v1/models;
  ``routes_console``: the runs list, a run's timeline, /v1/whoami, and the web console (``console/``, static);
- ``auth`` and ``tokens``: bearer tokens (hashed in PostgreSQL) to tenant and role;
- ``limits``: rate per tenant, requests and streams per replica, body size; ``problems``: RFC 9457 errors;
- ``cells``: tenants to cells and run ownership; ``hub``, ``stream``, ``positions``, ``sse``: the live
  fan-out, a run's stream and its resumable positions, the SSE wire; ``answer_text``: a chat stream's text.
"""
