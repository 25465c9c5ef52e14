// docs/contract.md, "With a schema registry": submit.js through a Confluent-compatible registry (Confluent,
// Karapace, Apicurio's /apis/ccompat/v7) with @kafkajs/confluent-schema-registry, no agentstream code. The
// deployment must use the same registry (AGENTSTREAM_SCHEMA_REGISTRY_URL on every agentstream process): its
// workers register the schemas this example writes and reads with. Run from the repository's root:
// SCHEMA_REGISTRY_URL=http://HOST:8080/apis/ccompat/v7 node examples/contract/node/submit_registry.js [SESSION]
const fs = require('fs');
const crypto = require('crypto');
const { SchemaRegistry } = require('@kafkajs/confluent-schema-registry');
const { Kafka, Partitioners, logLevel } = require('kafkajs');

const env = (name, otherwise) => process.env[name] || otherwise;
const BROKERS = env('KAFKA_BOOTSTRAP_SERVERS', '127.0.0.1:17092').split(',');
const PREFIX = env('AGENTSTREAM_TOPIC_PREFIX', '');  // the deployment's topic prefix
const SCHEMAS = env('AGENTSTREAM_SCHEMAS_DIR', 'schemas');
const REGISTRY = env('SCHEMA_REGISTRY_URL', 'http://127.0.0.1:8080/apis/ccompat/v7');
const WAIT_S = Number(env('WAIT_S', '60'));  // how long to wait for the outcome

// The subject is the record's full name (RecordNameStrategy), e.g. io.agentstream.events.TaskSubmitted.
const subject = (record) => {
  const { namespace, name } = JSON.parse(fs.readFileSync(`${SCHEMAS}/${record}.avsc`, 'utf8'));
  return `${namespace}.${name}`;
};
// Kafka's murmur2: the hash kafkajs's default partitioner (and Java's) gives a key.
function murmur2(key) {
  const data = Buffer.from(key, 'utf8'), m = 0x5bd1e995;
  let h = (0x9747b28c ^ data.length) | 0, i = 0;
  for (; i + 4 <= data.length; i += 4) {
    let k = data.readInt32LE(i);
    k = Math.imul(k, m); k ^= k >>> 24; k = Math.imul(k, m);
    h = Math.imul(h, m) ^ k;
  }
  switch (data.length - i) {
    case 3: h ^= data[i + 2] << 16;  // falls through
    case 2: h ^= data[i + 1] << 8;   // falls through
    case 1: h ^= data[i]; h = Math.imul(h, m);
  }
  h ^= h >>> 13; h = Math.imul(h, m); h ^= h >>> 15;
  return h & 0x7fffffff;
}

async function main() {
  const session = process.argv[2] ?? 'example-session';  // the conversation this task is a turn of
  const registry = new SchemaRegistry({ host: REGISTRY });
  // Write with the version agentstream registered (its id is the registry's); the library checks the task
  // against it. avsc drops logical types it was not given, so timestamps are plain longs (microseconds) here.
  const taskId = await registry.getLatestSchemaId(subject('TaskSubmitted'));
  const kafka = new Kafka({ clientId: 'my-node-app', brokers: BROKERS, logLevel: logLevel.WARN });
  const tasks = `${PREFIX}agent.tasks`, outcomesTopic = `${PREFIX}agent.outcomes`;

  // Read the outcomes from just before the task is sent: the offsets then, one per partition.
  const since = Date.now() - 1000;
  const admin = kafka.admin();
  await admin.connect();
  const starts = await admin.fetchTopicOffsetsByTimestamp(outcomesTopic, since);
  await admin.disconnect();

  // A turn's run id must be on its session's partition (agent.tasks has as many as agent.outcomes).
  const partition = (key) => murmur2(key) % starts.length;
  let runId;
  do { runId = `run-${crypto.randomBytes(8).toString('hex')}`; } while (partition(runId) !== partition(session));

  const consumer = kafka.consumer({ groupId: `my-node-app-${runId}` });  // a group of this app's own; any name
  await consumer.connect();
  await consumer.subscribe({ topics: [outcomesTopic], fromBeginning: false });

  const done = new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ message }) => {
        if (!message.key || message.key.toString() !== runId || !message.value) return;
        const outcome = await registry.decode(message.value);  // any id the registry knows: RunCompleted, RunFailed
        resolve(['error_code' in outcome ? 'RunFailed' : 'RunCompleted', outcome]);
      },
    });
  });
  // kafkajs applies these seeks once the consumer runs and has its partitions.
  for (const { partition, offset } of starts) consumer.seek({ topic: outcomesTopic, partition, offset });

  const producer = kafka.producer({ createPartitioner: Partitioners.JavaCompatiblePartitioner, idempotent: true });
  await producer.connect();
  await producer.send({
    topic: tasks,
    acks: -1,
    messages: [{
      key: runId,
      headers: { 'agentstream-session': session },
      value: await registry.encode(taskId, {
        event_id: crypto.randomUUID(), run_id: runId, step_id: `${runId}:task`, parent_step_id: null, attempt: 0,
        created_at: Date.now() * 1000, producer: { service: 'my-node-app', instance: 'host-1' },
        // The [[...]] directives script the test model of `agentstream worker all` (--backend scripted),
        // which writes no JSON of its own; a real model needs only the question.
        task: 'What is 6 * 7? [[tool:calculator {"expression": "6 * 7"}]] [[answer:{"result": 42}]]',
        tools: ['calculator'], max_steps: 8, deadline: null, model: null,
        system_prompt: null, metadata: {}, prefetch: true, on_tool_error: 'tell_model', replay_of: null,
        output_schema: JSON.stringify({ type: 'object', properties: { result: { type: 'integer' } }, required: ['result'] }),
        max_tokens: null, temperature: null, top_p: null, stop: [], seed: null, session, tool_calling: null,
        agent: null, parent_run_id: null, depth: 0,
      }),
    }],
  });
  await producer.disconnect();
  console.log(`run ${runId} submitted to ${tasks} (session ${session})`);

  // Wait for the run's outcome, with a timeout: a record the pipeline refuses is answered too (RunFailed
  // invalid_task), so silence means no planner runs, or it is slow: see `agentstream dlq list` and its logs.
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve([null, null]), WAIT_S * 1000); });
  const [record, outcome] = await Promise.race([done, timeout]);
  clearTimeout(timer);
  await consumer.disconnect();
  if (record === null) {
    console.error(`no outcome for ${runId} on ${outcomesTopic} within ${WAIT_S} s`);
    process.exit(2);
  }
  if (record === 'RunFailed') {
    console.error(`RunFailed ${outcome.error_code}: ${outcome.error}`);
    process.exit(1);
  }
  console.log(record, outcome.answer);
  if (outcome.output) console.log('result:', JSON.parse(outcome.output).result);  // valid against output_schema
}

main().catch((err) => { console.error(err); process.exit(1); });
