package simllm

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

func startInference(t *testing.T) *Server {
	t.Helper()
	s, err := Start("test-model")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestInferenceModelsAndChat(t *testing.T) {
	t.Parallel()
	s := startInference(t)
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") || s.Port() == 0 {
		t.Fatalf("URL %q", s.URL())
	}
	m := call(t, "GET", s.URL()+"/v1/models", "", nil).JSON(t)
	if m["data"].([]any)[0].(map[string]any)["id"] != "test-model" {
		t.Fatalf("models: %v", m)
	}
	r := call(t, "POST", s.URL()+"/v1/chat/completions", "", map[string]any{
		"model": "test-model", "messages": []map[string]any{{"role": "user", "content": "hello there"}}})
	m = r.JSON(t)
	msg := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	if r.Status != 200 || !strings.Contains(msg, "hello there") || m["usage"].(map[string]any)["prompt_tokens"] != float64(2) {
		t.Fatalf("chat: HTTP %d %s", r.Status, r.Body)
	}
	if bad := call(t, "POST", s.URL()+"/v1/chat/completions", "", map[string]any{"messages": []any{}}); bad.Status != 400 {
		t.Fatalf("empty messages: HTTP %d", bad.Status)
	}
}

func TestInferenceStreamsChunkByChunk(t *testing.T) {
	t.Parallel()
	s := startInference(t)
	s.SetChunkDelay(20 * time.Millisecond)
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,
		"messages":[{"role":"user","content":[{"type":"text","text":"one two three"}]}]}`
	resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var arrivals []time.Time
	var text strings.Builder
	sawUsage, done := false, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		arrivals = append(arrivals, time.Now())
		if data == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]int `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		for _, c := range ev.Choices {
			text.WriteString(c.Delta.Content)
			if c.FinishReason != nil && *c.FinishReason != "length" {
				t.Fatalf("finish_reason %q, want length", *c.FinishReason)
			}
		}
		if ev.Usage != nil {
			sawUsage = ev.Usage["completion_tokens"] == 4
		}
	}
	if !done || !sawUsage || len(strings.Fields(text.String())) != 4 {
		t.Fatalf("done %v, usage %v, text %q", done, sawUsage, text.String())
	}
	// Role chunk, 4 words, finish, usage: the chunks arrive spread out, not
	// in one buffered burst.
	if spread := arrivals[len(arrivals)-2].Sub(arrivals[0]); spread < 80*time.Millisecond {
		t.Fatalf("chunks arrived within %v; not flushed one by one", spread)
	}
}

func TestInferenceHangAndClose(t *testing.T) {
	t.Parallel()
	s := startInference(t)
	s.SetHang(true)
	c := &http.Client{Timeout: 50 * time.Millisecond}
	if _, err := c.Get(s.URL() + "/v1/models"); err == nil {
		t.Fatal("hang mode answered")
	}
	s.SetHang(false)
	if r := call(t, "GET", s.URL()+"/health", "", nil); r.Status != 200 {
		t.Fatalf("health: HTTP %d", r.Status)
	}
	if s.Requests() != 2 {
		t.Fatalf("requests %d, want 2", s.Requests())
	}
	s.SetHang(true)
	errc := make(chan error, 1)
	go func() {
		_, err := http.Get(s.URL() + "/v1/models")
		errc <- err
	}()
	testpoll.Until(t, 5*time.Second, "the request reaches the hung server", func() bool { return s.Requests() == 3 })
	s.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("hung request answered after Close")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end a hung request")
	}
	s.Close() // idempotent
	if _, err := http.Get(s.URL() + "/v1/models"); err == nil {
		t.Fatal("listener still up after Close")
	}
}

// call sends a JSON request to the simulator (it takes no key).
func call(t *testing.T, method, u, _ string, body any) teststack.Response {
	t.Helper()
	return teststack.SendJSON(t, method, u, body)
}

// TestRequestBodyCap: a chat body of exactly MaxRequestBody bytes is read,
// one byte more is refused.
func TestRequestBodyCap(t *testing.T) {
	t.Parallel()
	s := startInference(t)
	post := func(size int) int {
		t.Helper()
		head, tail := `{"messages":[{"role":"user","content":"`, `"}]}`
		body := head + strings.Repeat("a", size-len(head)-len(tail)) + tail
		resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := post(MaxRequestBody); st != http.StatusOK {
		t.Fatalf("body of MaxRequestBody bytes: HTTP %d", st)
	}
	if st := post(MaxRequestBody + 1); st != http.StatusBadRequest {
		t.Fatalf("body one byte over MaxRequestBody: HTTP %d", st)
	}
}
