import java.io.ByteArrayOutputStream;
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.*;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.*;
import org.apache.avro.io.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;
import org.apache.kafka.common.utils.Utils;

public class SubmitTask {
  static String env(String name, String otherwise) {
    String value = System.getenv(name);
    return value == null || value.isEmpty() ? otherwise : value;
  }

  static final String BOOTSTRAP = env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:17092");
  static final String PREFIX = env("AGENTSTREAM_TOPIC_PREFIX", "");      // the deployment's topic prefix
  static final String SCHEMAS = env("AGENTSTREAM_SCHEMAS_DIR", "schemas");
  static final long WAIT_S = Long.parseLong(env("WAIT_S", "60"));        // how long to wait for the outcome

  /** The schema id without a registry: SHA-256 of the Parsing Canonical Form, first 4 bytes, top bit cleared. */
  static int schemaId(Schema schema) throws Exception {
    return ByteBuffer.wrap(SchemaNormalization.parsingFingerprint("SHA-256", schema)).getInt() & 0x7fffffff;
  }

  static Schema schema(String record) throws Exception {
    return new Schema.Parser().parse(new File(SCHEMAS, record + ".avsc"));
  }

  static byte[] encode(Schema schema, GenericRecord datum) throws Exception {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(0);                                                          // magic byte
    out.write(ByteBuffer.allocate(4).putInt(schemaId(schema)).array());    // schema id, big-endian
    BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(out, null);
    new GenericDatumWriter<GenericRecord>(schema).write(datum, encoder);
    encoder.flush();
    return out.toByteArray();
  }

  /** The partition kafka-clients' default partitioner gives a key (murmur2). */
  static int partition(String key, int partitions) {
    return Utils.toPositive(Utils.murmur2(key.getBytes(StandardCharsets.UTF_8))) % partitions;
  }

  public static void main(String[] args) throws Exception {
    String session = args.length > 0 ? args[0] : "example-session";  // the conversation this task is a turn of
    String tasks = PREFIX + "agent.tasks", outcomesTopic = PREFIX + "agent.outcomes";
    Schema taskSchema = schema("TaskSubmitted");
    Map<Integer, Schema> outcomes = new HashMap<>();
    for (String name : List.of("RunCompleted", "RunFailed")) {
      Schema s = schema(name);
      outcomes.put(schemaId(s), s);
    }

    Properties c = new Properties();
    c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
    c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    try (KafkaConsumer<String, byte[]> consumer =
             new KafkaConsumer<>(c, new StringDeserializer(), new ByteArrayDeserializer())) {
      List<PartitionInfo> partitions = consumer.partitionsFor(outcomesTopic);  // as many as agent.tasks
      // A turn's run id must be on its session's partition: draw until it is.
      String runId;
      do { runId = "run-" + UUID.randomUUID().toString().replace("-", "").substring(0, 16); }
      while (partition(runId, partitions.size()) != partition(session, partitions.size()));

      GenericRecord producer = new GenericData.Record(taskSchema.getField("producer").schema());
      producer.put("service", "my-java-app");
      producer.put("instance", "host-1");
      GenericRecord task = new GenericData.Record(taskSchema);
      task.put("event_id", UUID.randomUUID().toString());
      task.put("run_id", runId);
      task.put("step_id", runId + ":task");
      task.put("attempt", 0);
      task.put("created_at", ChronoUnit.MICROS.between(Instant.EPOCH, Instant.now()));  // timestamp-micros
      task.put("producer", producer);
      // The [[...]] directives script the test model of `agentstream worker all` (--backend scripted), which
      // writes no JSON of its own; a real model needs only the question.
      task.put("task", "What is 6 * 7? [[tool:calculator {\"expression\": \"6 * 7\"}]] [[answer:{\"result\": 42}]]");
      task.put("tools", List.of("calculator"));
      task.put("max_steps", 8);
      task.put("metadata", Map.of());
      task.put("prefetch", true);
      task.put("on_tool_error", "tell_model");
      task.put("output_schema",  // the answer as JSON of this schema: RunCompleted.output
          "{\"type\": \"object\", \"properties\": {\"result\": {\"type\": \"integer\"}}, \"required\": [\"result\"]}");
      task.put("stop", List.of());  // an array: never null
      task.put("session", session);
      task.put("depth", 0);  // an int: never null
      // parent_step_id, deadline, model, system_prompt, replay_of, max_tokens, temperature, top_p, seed,
      // tool_calling, agent, parent_run_id: null (unset)

      // Read the outcomes from just before the task is sent: none can slip past.
      long since = System.currentTimeMillis() - 1000;
      Map<TopicPartition, Long> query = new HashMap<>();
      for (PartitionInfo p : partitions) {
        query.put(new TopicPartition(outcomesTopic, p.partition()), since);
      }
      consumer.assign(query.keySet());
      consumer.seekToEnd(query.keySet());
      consumer.offsetsForTimes(query).forEach((tp, found) -> { if (found != null) consumer.seek(tp, found.offset()); });

      Properties p = new Properties();
      p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
      p.put(ProducerConfig.ACKS_CONFIG, "all");
      try (KafkaProducer<String, byte[]> kafka =     // the default partitioner: murmur2 of the key
               new KafkaProducer<>(p, new StringSerializer(), new ByteArraySerializer())) {
        ProducerRecord<String, byte[]> record = new ProducerRecord<>(tasks, runId, encode(taskSchema, task));
        record.headers().add("agentstream-session", session.getBytes(StandardCharsets.UTF_8));
        kafka.send(record).get();
      }
      System.out.println("run " + runId + " submitted to " + tasks + " (session " + session + ")");

      // Wait for the run's outcome, with a timeout: a record the pipeline refuses is answered too (RunFailed
      // invalid_task), so silence means no planner runs, or it is slow: see `agentstream dlq list` and its logs.
      long deadline = System.currentTimeMillis() + WAIT_S * 1000;
      while (System.currentTimeMillis() < deadline) {
        for (ConsumerRecord<String, byte[]> r : consumer.poll(Duration.ofSeconds(1))) {
          ByteBuffer value = ByteBuffer.wrap(r.value());
          if (!runId.equals(r.key()) || value.get() != 0) continue;
          Schema schema = outcomes.get(value.getInt());
          if (schema == null) continue;
          BinaryDecoder decoder = DecoderFactory.get().binaryDecoder(r.value(), 5, r.value().length - 5, null);
          GenericRecord outcome = new GenericDatumReader<GenericRecord>(schema).read(null, decoder);
          if (schema.getName().equals("RunFailed")) {
            System.err.println("RunFailed " + outcome.get("error_code") + ": " + outcome.get("error"));
            System.exit(1);
          }
          System.out.println("RunCompleted " + outcome.get("answer"));
          if (outcome.get("output") != null) {
            // JSON text, valid against output_schema: parse it with your JSON library
            // (Jackson: new ObjectMapper().readTree(outcome.get("output").toString()).get("result").asInt())
            System.out.println("output: " + outcome.get("output"));
          }
          return;
        }
      }
      System.err.println("no outcome for " + runId + " on " + outcomesTopic + " within " + WAIT_S + " s");
      System.exit(2);
    }
  }
}
