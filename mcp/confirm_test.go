package mcp_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/mcp"
)

// TestConfirmationOverMCP: a key with confirm_above asks a client that
// declared elicitation — directly before 2026-07-28, as a multi-round-trip
// input request from then on (a decline rents nothing, an accept rents) — and
// answers a plain POST with confirmation_required and a confirm_token that
// the same call repeated with it redeems once.
func TestConfirmationOverMCP(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true})
	key, p := s.key("acme", "assistant")
	above := gpuproxy.Micros(gpuproxy.MicrosPerUSD / 100)
	if err := s.auth.SetConfirmAbove(context.Background(), p.AccountID, p.KeyID, &above); err != nil {
		t.Fatal(err)
	}
	offer, _ := s.cheapestOffer()
	args := map[string]any{"provider": "vast.ai", "instance_id": offer, "image": "vllm/vllm-openai:latest"}

	for _, via := range []string{viaStreamable, viaStdio, viaLegacyHTTP} {
		t.Run(via, func(t *testing.T) {
			var answer atomic.Value
			var asked atomic.Value
			cs := s.connect(via, key, &sdk.ClientOptions{
				ElicitationHandler: func(_ context.Context, r *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
					asked.Store(r.Params.Message)
					return &sdk.ElicitResult{Action: answer.Load().(string), Content: map[string]any{"confirm": true}}, nil
				}})
			answer.Store("decline")
			res := callTool(t, cs, "create_gpu_instance", args)
			if !res.IsError || !strings.Contains(text(res), "declined") {
				t.Fatalf("declined: %s", text(res))
			}
			if m, _ := asked.Load().(string); !strings.Contains(m, "/hour") || !strings.Contains(m, offer) {
				t.Fatalf("the person was asked %q", m)
			}
			answer.Store("accept")
			res = callTool(t, cs, "create_gpu_instance", args)
			if res.IsError {
				t.Fatalf("accepted: %s", text(res))
			}
			offer, _ = s.cheapestOffer() // the rented offer is gone
			args["instance_id"] = offer
		})
	}

	call := func(extra string) rpcAnswer {
		return s.post(mcp.PlainPath, key, fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_gpu_instance",`+
			`"arguments":{"provider":"vast.ai","instance_id":%q,"image":"i"%s}}}`, offer, extra))
	}
	a := call("")
	r := a.result()
	body := fmt.Sprint(r["content"])
	m := regexp.MustCompile(`"confirm_token":"(gpc_[^"]+)"`).FindStringSubmatch(body)
	if r["isError"] != true || !strings.Contains(body, "confirmation_required") || m == nil {
		t.Fatalf("plain POST without confirmation: %s", a.raw)
	}
	if r := call(`,"confirm_token":"` + m[1] + `"`).result(); r["isError"] == true {
		t.Fatalf("plain POST with the token: %v", r)
	}
	// Used, and bound to its offer: another create with it is asked again.
	offer, _ = s.cheapestOffer()
	if r := call(`,"confirm_token":"` + m[1] + `"`).result(); r["isError"] != true ||
		!strings.Contains(fmt.Sprint(r["content"]), "not valid for this create") {
		t.Fatalf("the token redeemed twice: %v", r)
	}
}
