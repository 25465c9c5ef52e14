-- Replays and forks point at the run they came from; sampled queries find a run's replays.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS replay_of text;
CREATE INDEX IF NOT EXISTS runs_replay_of ON runs (replay_of) WHERE replay_of IS NOT NULL;

CREATE OR REPLACE FUNCTION agentstream_set_replay_of() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.replay_of := NEW.state ->> 'replay_of';
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS runs_replay_of ON runs;
CREATE TRIGGER runs_replay_of BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION agentstream_set_replay_of();
