-- Workers announce where their /metrics endpoint is, so `agentstream top` finds them without a list.
-- A row is written when a worker starts serving metrics, refreshed every few seconds, deleted when the
-- worker stops; a row not refreshed for a while belongs to a worker that died.
CREATE TABLE IF NOT EXISTS workers (
    worker_id    text PRIMARY KEY,          -- host:pid
    services     text[] NOT NULL,
    topic_prefix text NOT NULL DEFAULT '',
    metrics_url  text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS workers_heartbeat ON workers (topic_prefix, heartbeat_at);
