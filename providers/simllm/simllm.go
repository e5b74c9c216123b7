// Package simllm is a tiny OpenAI-compatible inference server on loopback,
// the "model" every simulated GPU instance serves (vast.ai and io.net
// simulators alike), and an upstream for proxy tests and benchmarks.
package simllm

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultChunkDelay is the pause between streamed chunks of an
// Server unless SetChunkDelay changes it.
const DefaultChunkDelay = 5 * time.Millisecond

// MaxRequestBody is the largest chat request body, in bytes, a Server
// reads; a longer one is refused with 400 invalid_request_error. Test
// prompts are a few words, so 1 MiB only stops a runaway client.
const MaxRequestBody = 1 << 20

// Server is a tiny OpenAI-compatible inference endpoint on its own
// loopback listener: GET /v1/models, POST /v1/chat/completions (plain and
// "stream":true as server-sent events ending with "data: [DONE]") and
// GET /health. Replies are deterministic. It is safe for concurrent use.
type Server struct {
	model    string
	ln       net.Listener
	srv      *http.Server
	done     chan struct{}
	once     sync.Once
	requests atomic.Int64

	mu         sync.Mutex
	chunkDelay time.Duration
	hang       bool
}

// Start starts an Server serving model on 127.0.0.1 with
// a free port. Close stops it.
func Start(model string) (*Server, error) {
	if model == "" {
		model = "sim-llm"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for inference: %w", err)
	}
	s := &Server{model: model, ln: ln, done: make(chan struct{}), chunkDelay: DefaultChunkDelay}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /v1/completions", s.completion)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.srv = &http.Server{Handler: s.wrap(mux), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL returns the server's base URL, e.g. http://127.0.0.1:40123.
func (s *Server) URL() string { return "http://" + s.Addr() }

// Addr returns the listener's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Port returns the listener's port.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Model returns the served model id.
func (s *Server) Model() string { return s.model }

// Requests returns how many requests the server has received.
func (s *Server) Requests() int64 { return s.requests.Load() }

// SetChunkDelay sets the pause between streamed chunks.
func (s *Server) SetChunkDelay(d time.Duration) {
	s.mu.Lock()
	s.chunkDelay = d
	s.mu.Unlock()
}

// SetHang makes every request block, without a reply, until the client
// gives up or the server closes (on true), or restores normal replies.
func (s *Server) SetHang(on bool) {
	s.mu.Lock()
	s.hang = on
	s.mu.Unlock()
}

// Close stops the listener and ends every open request. It is idempotent.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.done)
		_ = s.srv.Close()
	})
}

func (s *Server) settings() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chunkDelay, s.hang
}

func (s *Server) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if _, hang := s.settings(); hang {
			select {
			case <-r.Context().Done():
			case <-s.done:
				panic(http.ErrAbortHandler) // drop the connection, never an empty 200
			}
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSONReply(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.model, "object": "model", "created": 1700000000, "owned_by": "vastaisim",
		}},
	})
}

type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Stream        bool `json:"stream"`
	MaxTokens     int  `json:"max_tokens"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// contentText reads a message content: a string or a list of text parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBody)).Decode(&req); err != nil || len(req.Messages) == 0 {
		writeJSONReply(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
			"message": "request must be JSON with a non-empty messages list",
			"type":    "invalid_request_error", "code": nil,
		}})
		return
	}
	prompt, last := 0, ""
	for _, m := range req.Messages {
		t := contentText(m.Content)
		prompt += len(strings.Fields(t))
		if m.Role == "user" {
			last = t
		}
	}
	prompt = max(prompt, 1)
	if len(last) > 80 {
		last = last[:80]
	}
	words := strings.Fields(fmt.Sprintf("Simulated reply from %s to: %s", s.model, last))
	finish := "stop"
	if req.MaxTokens > 0 && len(words) > req.MaxTokens {
		words, finish = words[:req.MaxTokens], "length"
	}
	usage := map[string]any{"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + len(words)}
	id := fmt.Sprintf("chatcmpl-sim%d", s.requests.Load())
	created := time.Now().Unix()
	if !req.Stream {
		writeJSONReply(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": s.model,
			"choices": []map[string]any{{
				"index":         0,
				"message":       map[string]any{"role": "assistant", "content": strings.Join(words, " ")},
				"finish_reason": finish,
			}},
			"usage": usage,
		})
		return
	}
	s.stream(w, r, id, created, words, finish, req.StreamOptions.IncludeUsage, usage)
}

// stream writes one SSE chunk per word, flushed one by one with a pause.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, id string, created int64,
	words []string, finish string, includeUsage bool, usage map[string]any) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	chunk := func(delta map[string]any, finishReason any) map[string]any {
		return map[string]any{
			"id": id, "object": "chat.completion.chunk", "created": created, "model": s.model,
			"choices": []map[string]any{{"index": 0, "delta": delta, "finish_reason": finishReason}},
		}
	}
	events := []any{chunk(map[string]any{"role": "assistant", "content": ""}, nil)}
	for i, wd := range words {
		if i > 0 {
			wd = " " + wd
		}
		events = append(events, chunk(map[string]any{"content": wd}, nil))
	}
	events = append(events, chunk(map[string]any{}, finish))
	if includeUsage {
		events = append(events, map[string]any{
			"id": id, "object": "chat.completion.chunk", "created": created, "model": s.model,
			"choices": []any{}, "usage": usage,
		})
	}
	for i, ev := range events {
		if i > 0 {
			delay, _ := s.settings()
			select {
			case <-r.Context().Done():
				return
			case <-s.done:
				// The server went away mid-stream (an instance preempted):
				// the connection drops, the stream is never ended whole.
				panic(http.ErrAbortHandler)
			case <-time.After(delay):
			}
		}
		b, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// completion answers POST /v1/completions (the legacy text API): the
// prompt's first words echoed, with usage.
func (s *Server) completion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt    json.RawMessage `json:"prompt"`
		MaxTokens int             `json:"max_tokens"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBody)).Decode(&req); err != nil || len(req.Prompt) == 0 {
		writeJSONReply(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
			"message": "request must be JSON with a prompt", "type": "invalid_request_error", "code": nil}})
		return
	}
	prompt := contentText(req.Prompt)
	words := strings.Fields("Simulated completion of: " + prompt)
	if req.MaxTokens > 0 && len(words) > req.MaxTokens {
		words = words[:req.MaxTokens]
	}
	n := max(len(strings.Fields(prompt)), 1)
	writeJSONReply(w, http.StatusOK, map[string]any{
		"id": fmt.Sprintf("cmpl-sim%d", s.requests.Load()), "object": "text_completion", "created": time.Now().Unix(),
		"model":   s.model,
		"choices": []map[string]any{{"index": 0, "text": strings.Join(words, " "), "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": n, "completion_tokens": len(words), "total_tokens": n + len(words)},
	})
}

// embeddings answers POST /v1/embeddings: a small vector per input
// derived from its bytes.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Input json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBody)).Decode(&req); err != nil || len(req.Input) == 0 {
		writeJSONReply(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
			"message": "request must be JSON with an input", "type": "invalid_request_error", "code": nil}})
		return
	}
	var inputs []string
	if json.Unmarshal(req.Input, &inputs) != nil {
		inputs = []string{contentText(req.Input)}
	}
	data, tokens := make([]map[string]any, 0, len(inputs)), 0
	for i, in := range inputs {
		vec := make([]float64, 8)
		for j, b := range []byte(in) {
			vec[j%8] += float64(b) / 255
		}
		tokens += max(len(strings.Fields(in)), 1)
		data = append(data, map[string]any{"object": "embedding", "index": i, "embedding": vec})
	}
	writeJSONReply(w, http.StatusOK, map[string]any{"object": "list", "data": data, "model": s.model,
		"usage": map[string]any{"prompt_tokens": tokens, "total_tokens": tokens}})
}

func writeJSONReply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
