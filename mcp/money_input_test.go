package mcp_test

import (
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/mcp"
)

// Money in tool arguments follows gpuproxy.ParseUSD, as REST does: more
// than six decimal places is a tool error naming the argument, never
// rounded.
func TestMoneyArguments(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	for _, tc := range []struct {
		name, tool, args string
		field            string // "" when the call succeeds
		places           bool   // the error says "at most 6 decimal places"
	}{
		{"cost 7 places", "check_spending_limit", `{"estimated_cost":1.1234567}`, "estimated_cost", true},
		{"cost exponent places", "check_spending_limit", `{"estimated_cost":15e-7}`, "estimated_cost", true},
		{"cost 6 places", "check_spending_limit", `{"estimated_cost":1.123456}`, "", false},
		{"cost exponent", "check_spending_limit", `{"estimated_cost":1e1}`, "", false},
		{"max_price 7 places", "list_gpu_instances", `{"max_price":0.1234567}`, "max_price", true},
		{"max_price 6 places", "list_gpu_instances", `{"max_price":0.123456}`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := s.post(mcp.PlainPath, key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+tc.tool+`","arguments":`+tc.args+`}}`)
			res := a.result()
			if a.status != 200 || res == nil {
				t.Fatalf("%d %s", a.status, a.raw)
			}
			content, _ := res["content"].([]any)
			var msg string
			if len(content) > 0 {
				msg, _ = content[0].(map[string]any)["text"].(string)
			}
			if tc.field == "" {
				if res["isError"] == true {
					t.Fatalf("refused: %s", msg)
				}
				return
			}
			if res["isError"] != true || !strings.Contains(msg, "(invalid): "+tc.field+": ") {
				t.Fatalf("not an error naming %s: %s", tc.field, a.raw)
			}
			if strings.Contains(msg, "at most 6 decimal places") != tc.places {
				t.Fatalf("message %q (want the decimal places reason: %v)", msg, tc.places)
			}
		})
	}
	// The same through the SDK client over Streamable HTTP.
	cs := s.connect(viaStreamable, key, nil)
	res := callTool(t, cs, "check_spending_limit", map[string]any{"estimated_cost": 1.1234567})
	if !res.IsError || !strings.Contains(text(res), "estimated_cost: must have at most 6 decimal places") {
		t.Fatalf("SDK client: %s", text(res))
	}
}
