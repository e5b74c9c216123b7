package services_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// TestOpenAISDKAgainstAService runs the official OpenAI SDK for Node
// (e2e/openai-client) against a service of two replicas, with the base
// URL and API key an engineer would give it: the model list, a plain and
// a streamed chat completion, a completion, embeddings, and an unknown
// model's error as the SDK reads it.
func TestOpenAISDKAgainstAService(t *testing.T) {
	node, dir := teststack.OpenAIClient(t)
	s := newStack(t, dbtest.SQLite, stackOpts{})
	s.create(`{"name":"llama","model":"llama-70b",` + anyGPU + `,"image":"vllm/vllm-openai:latest","port":8000,` +
		`"replicas":{"min":2,"max":2}}`)
	s.waitReady("llama", 2, 30*time.Second)
	cmd := exec.Command(node, filepath.Join(dir, "client.mjs"))
	cmd.Env = append(os.Environ(), "GPUPROXY_BASE_URL="+s.bases[0]+"/v1", "GPUPROXY_API_KEY="+s.key, "MODEL=llama-70b")
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
}
