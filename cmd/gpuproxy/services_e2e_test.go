package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// TestSandboxServiceWithOpenAISDK is issue 22's first "done when": in
// the sandbox, a service of two replicas defined over REST, and the
// official OpenAI SDK for Node (e2e/openai-client) pointed at
// <sandbox>/v1 with the sandbox's API key: the model list, plain and
// streamed chat completions, a completion, embeddings, and an unknown
// model's error as the SDK reads it.
func TestSandboxServiceWithOpenAISDK(t *testing.T) {
	t.Parallel()
	node, dir := teststack.OpenAIClient(t)
	base, _, api := runSandbox(t, map[string]string{"GPUPROXY_LOG_LEVEL": "warn", "GPUPROXY_RATE_LIMIT": "0"})
	c := client{t: t, base: base}
	st, v := c.call("POST", "/api/v1/services", api, `{"name":"llama","model":"llama-70b",`+
		`"spec":{"max_price_per_hour":2,"providers":"vast.ai","max_attempts":20},"image":"vllm/vllm-openai:latest",`+
		`"port":8000,"replicas":{"min":2,"max":2}}`)
	if st != 201 {
		t.Fatalf("create: %d %v", st, v)
	}
	testpoll.WaitEvery(60*time.Second, 250*time.Millisecond, func() bool {
		_, v = c.call("GET", "/api/v1/services/llama", api, "")
		return v["ready_replicas"] == 2.0
	})
	if v["ready_replicas"] != 2.0 {
		t.Fatalf("not two ready replicas: %v", v)
	}
	cmd := exec.Command(node, filepath.Join(dir, "client.mjs"))
	cmd.Env = append(os.Environ(), "GPUPROXY_BASE_URL="+base+"/v1", "GPUPROXY_API_KEY="+api, "MODEL=llama-70b")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the OpenAI SDK client: %v\n%s", err, b)
	}
	t.Logf("the OpenAI SDK got: %s", b)
	var out struct {
		Models []string
		Chat   struct {
			Content, Finish string
			Usage           map[string]int
		}
		Stream struct {
			Content string
			Chunks  int
		}
		Completion string
		Embeddings []int
		Unknown    struct {
			Status     int
			Code, Type string
			Param      *string
		}
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("the client's output: %v\n%s", err, b)
	}
	switch {
	case !slices.Equal(out.Models, []string{"llama-70b"}):
		t.Errorf("models: %v", out.Models)
	case !strings.HasPrefix(out.Chat.Content, "Simulated reply") || out.Chat.Finish != "stop" || out.Chat.Usage["completion_tokens"] == 0:
		t.Errorf("chat: %+v", out.Chat)
	case !strings.Contains(out.Stream.Content, "Stream a greeting") || out.Stream.Chunks < 5:
		t.Errorf("stream: %+v", out.Stream)
	case !strings.HasPrefix(out.Completion, "Simulated completion"):
		t.Errorf("completion: %q", out.Completion)
	case !slices.Equal(out.Embeddings, []int{8, 8}):
		t.Errorf("embeddings: %v", out.Embeddings)
	case out.Unknown.Status != 404 || out.Unknown.Code != "model_not_found" || out.Unknown.Type != "invalid_request_error" ||
		out.Unknown.Param == nil || *out.Unknown.Param != "model":
		t.Errorf("unknown model: %+v", out.Unknown)
	}
	// Both replicas served: the requests were spread over them.
	_, v = c.call("GET", "/api/v1/services/llama", api, "")
	if n := len(v["instances"].([]any)); n != 2 {
		t.Errorf("instances: %v", v["instances"])
	}

	// Issue 23: the summary by instance shows the replicas' tokens and,
	// once the sandbox has metered them (every 5 s), what a million
	// tokens cost.
	var rows []any
	if testpoll.WaitEvery(20*time.Second, 500*time.Millisecond, func() bool {
		// Metering dates a charge at the end of the minute it covers: the
		// period runs past now to hold the current minute's.
		to := time.Now().Add(2 * time.Minute).UTC().Format(time.RFC3339)
		st, sum := c.call("GET", "/api/v1/usage/summary?group_by=instance&to="+to, api, "")
		if st != 200 {
			t.Fatalf("summary: %d %v", st, sum)
		}
		rows, _ = sum["rows"].([]any)
		priced := 0
		for _, r := range rows {
			row := r.(map[string]any)
			if row["completion_tokens"].(float64) > 0 && row["gpu_cost_micros"].(float64) > 0 &&
				row["cost_per_1m_output_tokens_micros"].(float64) > 0 {
				priced++
			}
		}
		return priced == 2
	}) {
		t.Logf("summary by instance: %v", rows)
		return
	}
	t.Fatalf("the summary by instance does not show both replicas' tokens and $ per 1M tokens: %v", rows)
}
