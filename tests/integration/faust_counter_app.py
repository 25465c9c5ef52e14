"""A faust-streaming app with a Table, run as a worker process by test_faust_table.py.

Events on IN_TOPIC: value "inc" adds one to the key's count; value "dump" publishes the whole table
(as JSON) to OUT_TOPIC. The table lives in memory only, so after a restart its contents can only come
from the changelog topic faust keeps for it.
"""

import json
import os

import faust

app = faust.App(
    os.environ["APP_ID"],
    broker=f"kafka://{os.environ['BOOTSTRAP']}",
    store="memory://",
    web_enabled=False,
    topic_partitions=2,
    topic_replication_factor=1,
    broker_commit_every=1,
    broker_commit_interval=0.2,
    datadir=os.environ.get("DATADIR", "/tmp/agentstream-faust"),
)
events = app.topic(os.environ["IN_TOPIC"], key_type=str, value_type=str, value_serializer="raw")
out = app.topic(os.environ["OUT_TOPIC"], key_type=str, value_type=str, value_serializer="raw")
counts = app.Table("counts", default=int, partitions=2)


@app.agent(events)
async def count(stream):
    async for key, value in stream.items():
        value = value.decode() if isinstance(value, bytes) else value
        if value == "inc":
            counts[key] += 1
        elif value == "dump":
            await out.send(key=key, value=json.dumps(dict(counts.items())).encode())


if __name__ == "__main__":
    app.main()
