package services_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// openAIError is OpenAI's error shape.
type openAIError struct {
	Error struct {
		Message string
		Type    string
		Code    string
		Param   *string
	}
}

func do(t *testing.T, method, url, key, body string) (*http.Response, openAIError) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var e openAIError
	_ = json.Unmarshal(b, &e)
	if res.StatusCode >= 400 && (e.Error.Message == "" || e.Error.Type == "") {
		t.Fatalf("%s %s: %d is not in OpenAI's error shape: %s", method, url, res.StatusCode, b)
	}
	return res, e
}

// TestOpenAIEndpointErrors: every refusal of the services' endpoint is in
// OpenAI's error shape with the status its SDKs expect, naming the field
// (param) where one is at fault; a service with no ready replica answers
// 503 with Retry-After once its queue timeout has passed.
func TestOpenAIEndpointErrors(t *testing.T) {
	s := newStack(t, dbtest.SQLite, stackOpts{})
	// Its rents never find an offer: it stays without a replica.
	s.create(`{"name":"never","model":"never","spec":{"max_price_per_hour":0.001,"providers":"vast.ai"},"image":"img",` +
		`"port":8000,"replicas":{"min":0,"max":1},"queue_timeout":"1s"}`)
	base := s.bases[0]
	param := func(e openAIError) string {
		if e.Error.Param == nil {
			return ""
		}
		return *e.Error.Param
	}
	for _, c := range []struct {
		name, method, path, key, body string
		status                        int
		typ, code, param              string
	}{
		{"no key", "POST", "/v1/chat/completions", "", `{"model":"never"}`, 401, "authentication_error", "unauthorized", ""},
		{"bad key", "POST", "/v1/chat/completions", "gpx_nope", `{"model":"never"}`, 401, "authentication_error", "unauthorized", ""},
		{"not JSON", "POST", "/v1/chat/completions", s.key, `{"model":`, 400, "invalid_request_error", "invalid", "body"},
		{"not an object", "POST", "/v1/embeddings", s.key, `[1,2]`, 400, "invalid_request_error", "invalid", "body"},
		{"no model", "POST", "/v1/completions", s.key, `{"prompt":"x"}`, 400, "invalid_request_error", "invalid", "model"},
		{"unknown model", "POST", "/v1/chat/completions", s.key, `{"model":"gpt-9","messages":[]}`, 404, "invalid_request_error", "model_not_found", "model"},
		{"chat without messages", "POST", "/v1/chat/completions", s.key, `{"model":"never"}`, 400, "invalid_request_error", "invalid", "messages"},
		{"messages null", "POST", "/v1/chat/completions", s.key, `{"model":"never","messages":null}`, 400, "invalid_request_error", "invalid", "messages"},
		{"messages not a list", "POST", "/v1/chat/completions", s.key, `{"model":"never","messages":"hi"}`, 400, "invalid_request_error", "invalid", "messages"},
		{"retrieve an unknown model", "GET", "/v1/models/gpt-9", s.key, ``, 404, "invalid_request_error", "model_not_found", "model"},
		{"POST a model", "POST", "/v1/models/never", s.key, `{}`, 405, "invalid_request_error", "invalid", ""},
		{"GET a POST path", "GET", "/v1/chat/completions", s.key, ``, 405, "invalid_request_error", "invalid", ""},
		{"unknown path", "POST", "/v1/images/generations", s.key, `{}`, 404, "invalid_request_error", "not_found", ""},
	} {
		res, e := do(t, c.method, base+c.path, c.key, c.body)
		if res.StatusCode != c.status || e.Error.Type != c.typ || e.Error.Code != c.code || param(e) != c.param {
			t.Errorf("%s: %d %+v (param %q), want %d %s %s %q", c.name, res.StatusCode, e.Error, param(e), c.status, c.typ, c.code, c.param)
		}
	}
	// OpenAI's retrieve: one of the caller's models.
	req, _ := http.NewRequest("GET", base+"/v1/models/never", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	got, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(got.Body)
	got.Body.Close()
	var m struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	if got.StatusCode != 200 || json.Unmarshal(b, &m) != nil || m.ID != "never" || m.Object != "model" || m.OwnedBy != "never" {
		t.Errorf("GET /v1/models/never: %d %s", got.StatusCode, b)
	}
	// A body over the limit is refused (sent by hand, the upload on a
	// goroutine of its own: the server may answer and close while it
	// goes, which a client that only reads after writing sees as a reset).
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 2 << 20
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", s.key, size)
	go func() { _, _ = conn.Write(bytes.Repeat([]byte("a"), size)) }()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	big, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	var e413 openAIError
	_ = json.NewDecoder(big.Body).Decode(&e413)
	conn.Close()
	if big.StatusCode != 413 || e413.Error.Code != "too_large" || e413.Error.Type != "invalid_request_error" {
		t.Errorf("too large: %d %+v", big.StatusCode, e413.Error)
	}

	// No ready replica within the queue timeout: 503, Retry-After.
	start := time.Now()
	res, e := do(t, "POST", base+"/v1/chat/completions", s.key, `{"model":"never","messages":[]}`)
	if waited := time.Since(start); res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || e.Error.Code != "unavailable" ||
		waited < time.Second || !strings.Contains(e.Error.Message, "queue timeout (1s)") {
		t.Fatalf("no ready replica: %d Retry-After %q after %s: %+v", res.StatusCode, res.Header.Get("Retry-After"), waited, e.Error)
	}
	if ev := s.events("never"); count(ev, "service.woken") == 0 || count(ev, "service.scale_blocked") == 0 {
		t.Fatalf("the waiting request did not wake the service, or its rent was not refused: %v", ev)
	}
}

// TestOpenAIEndpointOverTheLimit: a request whose cost does not fit a
// window is refused 402 in OpenAI's shape, naming the window, before
// anything reaches the replica.
func TestOpenAIEndpointOverTheLimit(t *testing.T) {
	s := newStack(t, dbtest.SQLite, stackOpts{cost: 100 * gpuproxy.MicrosPerUSD,
		limits: []guardrails.Window{{Minutes: 60, Limit: 50 * gpuproxy.MicrosPerUSD}}})
	v := s.create(`{"name":"llama","model":"llama",` + anyGPU + `,"image":"img","port":8000}`)
	v = s.waitReady("llama", 1, 20*time.Second)
	inf := s.sim.InstanceInference(s.simID(v.Instances[0].InstanceID))
	before := inf.Requests()
	res, e := do(t, "POST", s.bases[0]+"/v1/chat/completions", s.key, `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
	if res.StatusCode != 402 || e.Error.Type != "insufficient_quota" || e.Error.Code != gpuproxy.ELIMIT ||
		!strings.Contains(e.Error.Message, "60-minute window") {
		t.Fatalf("over the limit: %d %+v", res.StatusCode, e.Error)
	}
	// Probes aside (GET /v1/models), no chat reached the replica: the
	// refusal above is the proxy's answer, so nothing is still in flight.
	if got := inf.Requests() - before; got > 1 {
		t.Fatalf("the replica got %d requests", got)
	}
}

// TestServiceEventsReachTheWebhook: the account's alert webhook gets the
// service's events (created, replica rented and ready, …) with the
// service named, each once.
func TestServiceEventsReachTheWebhook(t *testing.T) {
	got := make(chan map[string]any, 100)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p map[string]any
		_ = json.NewDecoder(r.Body).Decode(&p)
		got <- p
	}))
	defer hook.Close()
	s := newStack(t, dbtest.SQLite, stackOpts{alertsLoopback: true})
	if _, _, err := s.apps[0].Alerts.Set(context.Background(), s.acct.ID, hook.URL, []float64{0.5}, false); err != nil {
		t.Fatal(err)
	}
	s.create(`{"name":"hooked","model":"h",` + anyGPU + `,"image":"img","port":8000}`)
	s.waitReady("hooked", 1, 20*time.Second)
	seen := map[string]int{}
	deadline := time.After(20 * time.Second)
	for seen["service.replica_ready"] == 0 {
		select {
		case p := <-got:
			seen[p["type"].(string)]++
			if p["service"] != "hooked" || p["service_id"] == "" || !strings.Contains(p["text"].(string), "service hooked (model h)") {
				t.Fatalf("payload: %v", p)
			}
		case <-deadline:
			t.Fatalf("webhook got %v", seen)
		}
	}
	if seen["service.created"] != 1 || seen["service.replica_rented"] != 1 {
		t.Fatalf("webhook got %v", seen)
	}
}
