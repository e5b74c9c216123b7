package ionetsim

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// This file is the tiny OpenAI-compatible server each running container
// answers on its public_url: GET /v1/models, POST /v1/chat/completions
// (plain and "stream":true), and a health check on /. It is self-contained.

// defaultModel is served when the deployment sets no MODEL variable.
const defaultModel = "ionetsim/echo-1"

// inference is one container's inference listener.
type inference struct {
	srv     *http.Server
	url     string
	model   string
	delay   time.Duration
	created int64
	done    chan struct{}
	once    sync.Once
}

// startInference listens on a fresh loopback port.
func startInference(model string, chunkDelay time.Duration) (*inference, error) {
	if model == "" {
		model = defaultModel
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting inference listener: %w", err)
	}
	f := &inference{url: "http://" + ln.Addr().String(), model: model, delay: chunkDelay,
		created: time.Now().Unix(), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", f.models)
	mux.HandleFunc("POST /v1/chat/completions", f.chat)
	mux.HandleFunc("GET /{$}", f.health)
	mux.HandleFunc("GET /health", f.health)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		oaiError(w, http.StatusNotFound, "not_found", "no route for "+r.Method+" "+r.URL.Path)
	})
	f.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

// close stops the listener and drops open connections, streams included.
func (f *inference) close() {
	f.once.Do(func() {
		close(f.done)
		_ = f.srv.Close()
	})
}

func (f *inference) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (f *inference) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": f.model, "object": "model", "created": f.created, "owned_by": "ionetsim", "max_model_len": 8192,
	}}})
}

// chatRequest is the part of an OpenAI chat request the echo model reads.
type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Stream        bool `json:"stream"`
	MaxTokens     int  `json:"max_tokens"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// text returns a message content given as a string or as content parts.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// chat answers with an echo of the last user message, whole or streamed as
// server-sent events, one word per chunk, ending with data: [DONE].
func (f *inference) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		oaiError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON body: "+err.Error())
		return
	}
	if len(req.Messages) == 0 {
		oaiError(w, http.StatusBadRequest, "invalid_request_error", "messages must be a non-empty list")
		return
	}
	prompt := ""
	promptTokens := 0
	for _, m := range req.Messages {
		t := text(m.Content)
		promptTokens += len(strings.Fields(t)) + 1
		if m.Role == "user" {
			prompt = t
		}
	}
	words := strings.Fields("Hello from io.net (simulated). You said: " + prompt)
	finish := "stop"
	if req.MaxTokens > 0 && len(words) > req.MaxTokens {
		words, finish = words[:req.MaxTokens], "length"
	}
	id := "chatcmpl-" + randHex(12)
	now := time.Now().Unix()
	usage := map[string]int{"prompt_tokens": promptTokens, "completion_tokens": len(words),
		"total_tokens": promptTokens + len(words)}
	if !req.Stream {
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": now, "model": f.model,
			"choices": []map[string]any{{"index": 0, "finish_reason": finish,
				"message": map[string]string{"role": "assistant", "content": strings.Join(words, " ")}}},
			"usage": usage,
		})
		return
	}
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	chunk := func(delta map[string]string, reason any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": now, "model": f.model,
			"choices": []map[string]any{{"index": 0, "delta": delta, "finish_reason": reason}}}
	}
	if !send(chunk(map[string]string{"role": "assistant", "content": ""}, nil)) {
		return
	}
	for i, word := range words {
		if i > 0 {
			word = " " + word
		}
		if !f.pause(r) || !send(chunk(map[string]string{"content": word}, nil)) {
			return
		}
	}
	if !send(chunk(map[string]string{}, finish)) {
		return
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		send(map[string]any{"id": id, "object": "chat.completion.chunk", "created": now, "model": f.model,
			"choices": []any{}, "usage": usage})
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

// pause waits between chunks; false when the client left or we close.
func (f *inference) pause(r *http.Request) bool {
	t := time.NewTimer(f.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
	case <-f.done:
	}
	return false
}

// oaiError writes OpenAI's error shape.
func oaiError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
