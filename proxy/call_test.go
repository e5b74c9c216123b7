package proxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/proxy"
)

func invoker(acct int64) gpuproxy.Principal {
	return gpuproxy.Principal{AccountID: acct, Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}
}

func TestCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_call", s.URL())
	ctx := context.Background()

	status, hdr, body, err := e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/chat/completions", "",
		map[string]string{"content-type": "application/json", "x-api-key": "gpx_leak"}, chatBody(false, "from mcp"))
	if err != nil || status != 200 || !strings.Contains(string(body), "Simulated reply from sim-llm to: from mcp") {
		t.Fatalf("chat: %d %s %v", status, body, err)
	}
	if hdr["Content-Type"] != "application/json" || hdr["X-Request-Id"] == "" {
		t.Fatalf("headers = %v", hdr)
	}
	// A streamed answer comes back whole.
	status, hdr, body, err = e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/chat/completions", "POST", nil,
		chatBody(true, "streamed"))
	if err != nil || status != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") ||
		!strings.HasPrefix(hdr["Content-Type"], "text/event-stream") {
		t.Fatalf("stream: %d %q %v", status, body, err)
	}
	// GET by default without a body; the instance's 4xx is an answer.
	status, _, body, err = e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/models", "", nil, nil)
	if err != nil || status != 200 || !strings.Contains(string(body), "sim-llm") {
		t.Fatalf("models: %d %s %v", status, body, err)
	}
	status, _, _, err = e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/chat/completions", "POST", nil, []byte("{}"))
	if err != nil || status != 400 {
		t.Fatalf("bad request: %d %v", status, err)
	}

	// Refusals.
	for _, tc := range []struct {
		name   string
		p      gpuproxy.Principal
		target string
		method string
		body   []byte
		code   string
	}{
		{"another account", invoker(e.acct.ID + 100), s.URL() + "/v1/models", "GET", nil, gpuproxy.EFORBIDDEN},
		{"bad method", invoker(e.acct.ID), s.URL() + "/v1/models", "CONNECT", nil, gpuproxy.EINVALID},
		{"not a URL", invoker(e.acct.ID), "::nope", "GET", nil, gpuproxy.EINVALID},
		{"relative URL", invoker(e.acct.ID), "/v1/models", "GET", nil, gpuproxy.EINVALID},
		{"body too large", invoker(e.acct.ID), s.URL() + "/v1/chat/completions", "POST",
			make([]byte, 2<<20), gpuproxy.ETOOLARGE},
	} {
		_, _, _, err := e.proxy.Call(ctx, tc.p, tc.target, tc.method, nil, tc.body)
		if gpuproxy.ErrorCode(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	if s.Requests() != 4 {
		t.Fatalf("simulator saw %d requests, want 4", s.Requests())
	}
	page := e.usage(e.key, "?instance_id=gpi_call", 4)
	if page.Totals.Requests != 4 || page.Records[0].Path != "/v1/chat/completions" || page.Records[0].Status != 400 {
		t.Fatalf("usage = %+v", page)
	}
}

func TestCallTimeoutsAndFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{proxy: proxy.Options{UpstreamTimeout: 200 * time.Millisecond}})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_slow", s.URL())
	ctx := context.Background()

	s.SetHang(true)
	_, _, _, err := e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/models", "GET", nil, nil)
	if gpuproxy.ErrorCode(err) != proxy.CodeUpstreamTimeout || proxy.HTTPStatus(err) != 504 {
		t.Fatalf("hang: %v", err)
	}
	// A stream slower than the timeout is cut off as a timeout too (Call
	// buffers, so the whole exchange is bounded).
	s.SetHang(false)
	s.SetChunkDelay(100 * time.Millisecond)
	_, _, _, err = e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/chat/completions", "POST", nil, chatBody(true, "slow"))
	if gpuproxy.ErrorCode(err) != proxy.CodeUpstreamTimeout {
		t.Fatalf("slow stream: %v", err)
	}
	// The caller's own cancellation is reported as such.
	cctx, cancel := context.WithCancel(ctx)
	sent := s.Requests()
	go func() {
		// Once the request is at the instance (at most 5 s).
		testpoll.Wait(5*time.Second, func() bool { return s.Requests() > sent })
		cancel()
	}()
	_, _, _, err = e.proxy.Call(cctx, invoker(e.acct.ID), s.URL()+"/v1/chat/completions", "POST", nil, chatBody(true, "x"))
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		gpuproxy.ErrorCode(err) != proxy.CodeUpstreamTimeout {
		t.Fatalf("cancelled: %v", err)
	}
	s.Close()
	_, _, _, err = e.proxy.Call(ctx, invoker(e.acct.ID), s.URL()+"/v1/models", "GET", nil, nil)
	if gpuproxy.ErrorCode(err) != proxy.CodeUpstream || proxy.HTTPStatus(err) != 502 {
		t.Fatalf("closed instance: %v", err)
	}
}

// TestCallOverLimit: the guard rail refuses before anything is sent.
func TestCallOverLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{windows: []guardrails.Window{{Minutes: 60, Limit: usd}}})
	s := sim(t)
	e.fleet.add(e.acct.ID, "gpi_poor", s.URL())
	if _, err := e.ledger.Append(context.Background(), billing.Entry{AccountID: e.acct.ID, Type: billing.Charge,
		Amount: 2 * usd, Basis: billing.Manual}); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := e.proxy.Call(context.Background(), invoker(e.acct.ID), s.URL()+"/v1/models", "GET", nil, nil)
	if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT || proxy.HTTPStatus(err) != 402 {
		t.Fatalf("over limit: %v", err)
	}
	if d := gpuproxy.ErrorDetails(err); d["window_minutes"] != 60 || d["spent"] != gpuproxy.Micros(2*usd) {
		t.Fatalf("details = %v", d)
	}
	if s.Requests() != 0 || len(e.dials.dialed()) != 0 {
		t.Fatal("sent upstream despite the refusal")
	}
}
