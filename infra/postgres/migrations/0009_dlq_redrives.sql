-- Re-drives of dead letters (`agentstream dlq redrive`, streams/dlq.py): which letter's record was
-- republished to which source topic, from where (the letter itself, or the source topic when the letter
-- was truncated), by whom, and where the copy landed.
--
-- A letter is re-driven once unless forced. The row is written before the record is published
-- (status 'publishing') and confirmed after the broker acknowledged it ('published'); the partial unique
-- index makes the first unforced re-drive of a letter a claim that a concurrent or later one cannot
-- make. A forced re-drive adds a row of its own. A row left 'publishing' means the re-drive stopped
-- between the claim and the acknowledgement: the copy may or may not be on the topic.
CREATE TABLE IF NOT EXISTS dlq_redrives (
    id               bigserial PRIMARY KEY,
    dlq_topic        text NOT NULL,
    dlq_partition    integer NOT NULL,
    dlq_offset       bigint NOT NULL,
    letter_event_id  text NOT NULL,           -- with the offset: a recreated dead-letter topic's letters differ
    source_topic     text NOT NULL,
    source_partition integer NOT NULL,
    source_offset    bigint NOT NULL,
    value_from       text NOT NULL CHECK (value_from IN ('letter', 'source')),
    forced           boolean NOT NULL DEFAULT false,
    status           text NOT NULL DEFAULT 'publishing' CHECK (status IN ('publishing', 'published')),
    target_offset    bigint,                  -- the copy's offset in source_topic[source_partition]
    redriven_by      text NOT NULL DEFAULT '',
    redriven_at      timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS dlq_redrives_once
    ON dlq_redrives (dlq_topic, dlq_partition, dlq_offset, letter_event_id) WHERE NOT forced;
