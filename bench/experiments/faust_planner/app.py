"""The planner's core loop as a faust-streaming app, for bench/experiments/faust_vs_runtime.py.

A Table keyed by run id (in memory, restored from its changelog topic) counts each run's events; every
event produces one output. Events are taken in batches (``take_events``), which is faust's fast path;
``use_partitioner`` lets a batch write the table for keys of several partitions.
"""

import os

import faust

app = faust.App(
    os.environ["APP_ID"], broker=f"kafka://{os.environ['BOOTSTRAP']}", store="memory://", web_enabled=False,
    topic_partitions=int(os.environ.get("PARTITIONS", "4")), topic_replication_factor=1,
    broker_commit_interval=0.05, producer_acks=-1, broker_session_timeout=10,
    datadir=os.environ.get("DATADIR", "/tmp/agentstream-faust"),
)
inputs = app.topic(os.environ["IN"], key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
outputs = app.topic(os.environ["OUT"], key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
runs = app.Table("runs", default=int, partitions=int(os.environ.get("PARTITIONS", "4")), use_partitioner=True)


@app.agent(inputs)
async def plan(stream):
    async for batch in stream.take_events(256, within=0.002):
        for event in batch:
            key = event.key.decode()
            runs[key] += 1
            await outputs.send(key=event.key, value=b"%d" % runs[key])


if __name__ == "__main__":
    app.main()
