package proxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/proxy"
)

// tokenUpstream is an OpenAI-compatible server with fixed answers: a JSON
// chat answer with usage at its end, and a stream of events written in
// small pieces (events split across writes) whose usage chunk comes only
// when the request asks for it. With openAINulls every other chunk of a
// stream that asked for usage carries "usage":null, as OpenAI's API does.
type tokenUpstream struct {
	openAINulls bool
	asked       atomic.Int64 // requests whose stream_options.include_usage was true
}

const upstreamModel = "upstream-llm-7b"

// streamEvents are a stream's chunks, without and with usage.
func (u *tokenUpstream) streamEvents(withUsage bool) string {
	null := ""
	if withUsage && u.openAINulls {
		null = `,"usage":null`
	}
	var b strings.Builder
	for i, w := range []string{"Hello", " there", ",", " friend", "."} {
		fmt.Fprintf(&b, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]%s}`+"\n\n",
			upstreamModel, w, null)
		_ = i
	}
	fmt.Fprintf(&b, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]%s}`+"\n\n",
		upstreamModel, null)
	if withUsage {
		fmt.Fprintf(&b, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":5,"total_tokens":16}}`+"\n\n",
			upstreamModel)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

func (u *tokenUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad body", 400)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c0","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30}}`,
			upstreamModel, strings.Repeat("word ", 2000)) // long: usage is far from the model
		return
	}
	if req.StreamOptions.IncludeUsage {
		u.asked.Add(1)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	s := u.streamEvents(req.StreamOptions.IncludeUsage)
	f := w.(http.Flusher)
	for i := 0; i < len(s); i += 37 { // pieces that split events
		_, _ = w.Write([]byte(s[i:min(i+37, len(s))]))
		f.Flush()
		// pace: each piece arrives in a read of its own.
		time.Sleep(time.Millisecond)
	}
}

// TestUsageRecordsCarryTokens: on both stores, the usage record of a
// plain answer, of a stream whose client asked for usage and of one whose
// client did not carries the model and the tokens; the client that did
// not ask gets exactly the stream it would have got without our option
// (with stream_usage "add", the default), the one that asked gets the
// usage chunk; with stream_usage "off" the request is left alone.
func TestUsageRecordsCarryTokens(t *testing.T) {
	for _, k := range dbtest.Kinds {
		for _, nulls := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/openai-nulls=%v", k, nulls), func(t *testing.T) {
				up := &tokenUpstream{openAINulls: nulls}
				hs := httptest.NewServer(up)
				defer hs.Close()
				e := newEnv(t, envOpts{kind: k})
				e.fleet.add(e.acct.ID, "gpi_tok", hs.URL)
				path := "/api/v1/proxy/gpi_tok/v1/chat/completions"
				send := func(body string) []byte {
					t.Helper()
					r := e.do(e.key, "POST", path, []byte(body), map[string]string{"Content-Type": "application/json"})
					if r.Status != 200 {
						t.Fatalf("%s: %d %s", body, r.Status, r.Body)
					}
					return r.Body
				}
				plain := send(`{"model":"x","messages":[{"role":"user","content":"hi"}]}`)
				if !bytes.Contains(plain, []byte(`"prompt_tokens":21`)) {
					t.Fatalf("plain answer changed: %.200s", plain)
				}
				got := send(`{"model":"x","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
				if want := up.streamEvents(false); string(got) != want {
					t.Fatalf("a client that did not ask for usage got:\n%s\nwant:\n%s", got, want)
				}
				if up.asked.Load() != 1 {
					t.Fatalf("the upstream was asked for usage %d times, want 1", up.asked.Load())
				}
				got = send(`{"model":"x","stream":true,"stream_options":{"include_usage":true},"messages":[]}`)
				if want := up.streamEvents(true); string(got) != want {
					t.Fatalf("a client that asked for usage got:\n%s\nwant:\n%s", got, want)
				}
				page := e.usage(e.key, "", 3)
				if len(page.Records) != 3 {
					t.Fatalf("records: %+v", page.Records)
				}
				want := map[string][2]int64{} // newest first
				recs := page.Records
				for i, w := range [][2]int64{{11, 5}, {11, 5}, {21, 9}} {
					r := recs[i]
					if r.PromptTokens != w[0] || r.CompletionTokens != w[1] || r.Model != upstreamModel {
						t.Errorf("record %d (%s): model %q, tokens %d/%d, want %d/%d", i, r.RequestID, r.Model,
							r.PromptTokens, r.CompletionTokens, w[0], w[1])
					}
				}
				_ = want
				e.metrics.mu.Lock()
				counted := e.metrics.tokens[upstreamModel]
				e.metrics.mu.Unlock()
				if counted != [2]int64{43, 19} {
					t.Errorf("token metrics: %v, want 43 in, 19 out", counted)
				}
			})
		}
	}
}

// TestStreamUsageOffLeavesTheRequest: with stream_usage "off" a stream
// whose client did not ask for usage is not asked for it either.
func TestStreamUsageOffLeavesTheRequest(t *testing.T) {
	up := &tokenUpstream{}
	hs := httptest.NewServer(up)
	defer hs.Close()
	e := newEnv(t, envOpts{proxy: proxy.Options{StreamUsage: proxy.StreamUsageOff}})
	e.fleet.add(e.acct.ID, "gpi_tok", hs.URL)
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_tok/v1/chat/completions",
		[]byte(`{"model":"x","stream":true,"messages":[]}`), nil)
	if r.Status != 200 || string(r.Body) != up.streamEvents(false) || up.asked.Load() != 0 {
		t.Fatalf("%d asked %d: %s", r.Status, up.asked.Load(), r.Body)
	}
	page := e.usage(e.key, "", 1)
	// No usage chunk: the content events delivered count as its tokens.
	if rec := page.Records[0]; rec.PromptTokens != 0 || rec.CompletionTokens != 5 || rec.Model != upstreamModel {
		t.Fatalf("record: %+v", rec)
	}
}

// TestJSONAnswerKeepsItsLength: reading a JSON answer's tokens does not
// change it, so it keeps the Content-Length the instance gave it (a
// complete answer of known length is what lets the server take the
// keep-alive connection over after it) and its record has the tokens.
func TestJSONAnswerKeepsItsLength(t *testing.T) {
	body := `{"id":"c0","object":"chat.completion","model":"` + upstreamModel + `","choices":[],` +
		`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write([]byte(body))
	}))
	defer hs.Close()
	e := newEnv(t, envOpts{})
	e.fleet.add(e.acct.ID, "gpi_len", hs.URL)
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_len/v1/chat/completions", []byte(`{"model":"x","messages":[]}`),
		map[string]string{"Content-Type": "application/json"})
	if r.Status != 200 || string(r.Body) != body {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	if got := r.Header.Get("Content-Length"); got != fmt.Sprint(len(body)) {
		t.Fatalf("Content-Length %q, want %d (Transfer-Encoding %q)", got, len(body), r.Header.Get("Transfer-Encoding"))
	}
	rec := e.usage(e.key, "", 1).Records[0]
	if rec.PromptTokens != 4 || rec.CompletionTokens != 2 || rec.Model != upstreamModel {
		t.Fatalf("record: %+v", rec)
	}
}
