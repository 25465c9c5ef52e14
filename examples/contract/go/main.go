package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Schema ids without a registry (docs/contract.md, "Schema ids"). Neither hamba/avro's Fingerprint nor
// goavro's CanonicalSchema gives them: both keep logical types in the canonical form.
const (
	taskSubmittedID = 1264757939
	runCompletedID  = 2031083406
	runFailedID     = 167922929
)

func env(name, otherwise string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return otherwise
}

var (
	bootstrap  = env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:17092")
	prefix     = env("AGENTSTREAM_TOPIC_PREFIX", "") // the deployment's topic prefix
	schemas    = env("AGENTSTREAM_SCHEMAS_DIR", "schemas")
	partitions = number("AGENTSTREAM_PARTITIONS", "8")               // agent.tasks' partitions
	wait       = time.Duration(number("WAIT_S", "60")) * time.Second // how long to wait for the outcome
)

func number(name, otherwise string) uint32 {
	n, err := strconv.ParseUint(env(name, otherwise), 10, 32)
	if err != nil || n == 0 {
		fmt.Fprintf(os.Stderr, "%s must be a positive integer\n", name)
		os.Exit(2)
	}
	return uint32(n)
}

type Producer struct {
	Service  string `avro:"service"`
	Instance string `avro:"instance"`
}

type TaskSubmitted struct {
	EventID      string            `avro:"event_id"`
	RunID        string            `avro:"run_id"`
	StepID       string            `avro:"step_id"`
	ParentStepID *string           `avro:"parent_step_id"`
	Attempt      int32             `avro:"attempt"`
	CreatedAt    time.Time         `avro:"created_at"`
	Producer     Producer          `avro:"producer"`
	Task         string            `avro:"task"`
	Tools        []string          `avro:"tools"`
	MaxSteps     int32             `avro:"max_steps"`
	Deadline     *time.Time        `avro:"deadline"`
	Model        *string           `avro:"model"`
	SystemPrompt *string           `avro:"system_prompt"`
	Metadata     map[string]string `avro:"metadata"`
	Prefetch     bool              `avro:"prefetch"`
	OnToolError  string            `avro:"on_tool_error"`
	ReplayOf     *string           `avro:"replay_of"`
	OutputSchema *string           `avro:"output_schema"`
	MaxTokens    *int32            `avro:"max_tokens"`
	Temperature  *float64          `avro:"temperature"`
	TopP         *float64          `avro:"top_p"`
	Stop         []string          `avro:"stop"`
	Seed         *int64            `avro:"seed"`
	Session      *string           `avro:"session"`
	ToolCalling  *string           `avro:"tool_calling"`
	Agent        *string           `avro:"agent"`
	ParentRunID  *string           `avro:"parent_run_id"`
	Depth        int32             `avro:"depth"`
}

type Outcome struct { // the fields of RunCompleted and RunFailed read here
	RunID     string  `avro:"run_id"`
	Answer    string  `avro:"answer"`
	ErrorCode string  `avro:"error_code"`
	Error     string  `avro:"error"`
	Output    *string `avro:"output"` // RunCompleted: JSON text valid against the task's output_schema
}

func schema(record string) avro.Schema {
	text, err := os.ReadFile(schemas + "/" + record + ".avsc")
	if err != nil {
		panic(err)
	}
	return avro.MustParse(string(text))
}

// murmur2 is Kafka's hash of a key, as its default partitioner (and franz-go's) uses it.
func murmur2(b []byte) uint32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	h := seed ^ uint32(len(b))
	for ; len(b) >= 4; b = b[4:] {
		k := binary.LittleEndian.Uint32(b) * m
		k ^= k >> r
		h = h*m ^ k*m
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h = (h ^ uint32(b[0])) * m
	}
	h ^= h >> 13
	h *= m
	return (h ^ h>>15) & 0x7fffffff
}

func main() {
	session := "example-session" // the conversation this task is a turn of
	if len(os.Args) > 1 {
		session = os.Args[1]
	}
	// A turn's run id must be on its session's partition: draw until it is.
	part := func(key string) uint32 { return murmur2([]byte(key)) % partitions }
	var runID string
	for runID == "" || part(runID) != part(session) {
		id := make([]byte, 8)
		rand.Read(id)
		runID = "run-" + hex.EncodeToString(id)
	}
	eventID := make([]byte, 16)
	rand.Read(eventID)
	outputSchema := `{"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}`

	body, err := avro.Marshal(schema("TaskSubmitted"), TaskSubmitted{
		EventID: hex.EncodeToString(eventID), RunID: runID, StepID: runID + ":task", CreatedAt: time.Now(),
		Producer: Producer{Service: "my-go-app", Instance: "host-1"},
		// The [[...]] directives script the test model of `agentstream worker all` (--backend scripted),
		// which writes no JSON of its own; a real model needs only the question.
		Task:  `What is 6 * 7? [[tool:calculator {"expression": "6 * 7"}]] [[answer:{"result": 42}]]`,
		Tools: []string{"calculator"}, MaxSteps: 8, Metadata: map[string]string{}, Prefetch: true,
		OnToolError: "tell_model", OutputSchema: &outputSchema, Stop: []string{}, Session: &session,
	})
	if err != nil {
		panic(err)
	}
	value := binary.BigEndian.AppendUint32([]byte{0}, taskSubmittedID) // magic byte, schema id
	value = append(value, body...)

	// franz-go's default partitioner hashes keys with murmur2, as Kafka's Java client does. The outcomes
	// are read from just before the task is sent: none can slip past.
	since := time.Now().Add(-time.Second).UnixMilli()
	client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ConsumeTopics(prefix+"agent.outcomes"), kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since)))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	task := &kgo.Record{Topic: prefix + "agent.tasks", Key: []byte(runID), Value: value,
		Headers: []kgo.RecordHeader{{Key: "agentstream-session", Value: []byte(session)}}}
	if err := client.ProduceSync(context.Background(), task).FirstErr(); err != nil {
		panic(err)
	}
	fmt.Printf("run %s submitted to %s (session %s)\n", runID, task.Topic, session)

	// Wait for the run's outcome, with a timeout: a record the pipeline refuses is answered too (RunFailed
	// invalid_task), so silence means no planner runs, or it is slow: see `agentstream dlq list` and its logs.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	readers := map[uint32]avro.Schema{runCompletedID: schema("RunCompleted"), runFailedID: schema("RunFailed")}
	for ctx.Err() == nil {
		fetches := client.PollFetches(ctx)
		for _, r := range fetches.Records() {
			if string(r.Key) != runID || len(r.Value) < 5 || r.Value[0] != 0 {
				continue
			}
			if reader, ok := readers[binary.BigEndian.Uint32(r.Value[1:5])]; ok {
				var outcome Outcome
				if err := avro.Unmarshal(reader, r.Value[5:], &outcome); err != nil {
					panic(err)
				}
				if outcome.ErrorCode != "" {
					fmt.Fprintf(os.Stderr, "RunFailed %s: %s\n", outcome.ErrorCode, outcome.Error)
					os.Exit(1)
				}
				fmt.Println(reader.(*avro.RecordSchema).Name(), outcome.Answer)
				if outcome.Output != nil {
					var output struct {
						Result int `json:"result"`
					}
					if err := json.Unmarshal([]byte(*outcome.Output), &output); err != nil {
						panic(err)
					}
					fmt.Println("result:", output.Result)
				}
				return
			}
		}
	}
	fmt.Fprintf(os.Stderr, "no outcome for %s on %sagent.outcomes within %s\n", runID, prefix, wait)
	os.Exit(2)
}
