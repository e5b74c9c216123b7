package mcp_test

import (
	"strings"
	"testing"
)

// TestArgumentErrorsArePlain: invalid arguments come back as a tool error
// that names the argument, what was expected and what came, without the
// validator's internals.
func TestArgumentErrorsArePlain(t *testing.T) {
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "assistant")
	for _, tc := range []struct {
		tool, args, want string
	}{
		{"check_spending_limit", `{"estimated_cost":null}`, "argument estimated_cost must be a number, got null"},
		{"check_spending_limit", `{"estimated_cost":"lots"}`, `argument estimated_cost must be a number, got "lots"`},
		{"check_spending_limit", `{"estimated_cost":-1}`, "argument estimated_cost must be at least 0, got -1"},
		{"check_spending_limit", `{}`, "missing required argument estimated_cost"},
		{"check_spending_limit", `{"estimated_cost":1,"extra":true}`, "unknown argument extra"},
		{"create_gpu_instance", `{"provider":"vast.ai","instance_id":"1"}`, "missing required argument image"},
		{"create_gpu_instance", `{"provider":"aws","instance_id":"1","image":"x"}`, `argument provider must be one of vast.ai, got "aws"`},
		{"create_gpu_instance", `{"provider":"vast.ai","instance_id":5,"image":"x"}`, "argument instance_id must be a string, got 5"},
		{"create_gpu_instance", `{"provider":"vast.ai","instance_id":"1","image":"x","hours":0}`, "argument hours must be at least 1, got 0"},
		{"create_gpu_instance", `{"provider":"vast.ai","instance_id":"1","image":"x","ports":["a"]}`, "each item of argument ports must be an integer"},
		// The spec's fields are named by their path.
		{"create_gpu_instance", `{"image":"x","spec":{}}`, "missing required argument spec.max_price_per_hour"},
		{"create_gpu_instance", `{"image":"x","spec":{"max_price_per_hour":1,"num_gpus":0}}`, "argument spec.num_gpus must be at least 1, got 0"},
		{"create_gpu_instance", `{"image":"x","spec":{"max_price_per_hour":0}}`, "argument spec.max_price_per_hour must be greater than 0, got 0"},
		{"create_gpu_instance", `{"image":"x","spec":{"max_price_per_hour":1,"gpu":5}}`, "argument spec.gpu must be a string or an array, got 5"},
		{"create_gpu_instance", `{"image":"x","spec":{"max_price_per_hour":1,"gpu":[5]}}`, "each item of argument spec.gpu must be a string, got [5]"},
		{"create_gpu_instance", `{"image":"x","spec":{"max_price_per_hour":1,"billing":"monthly"}}`, `argument spec.billing must be one of hourly, prepaid, got "monthly"`},
		{"create_gpu_instance", `{"image":"x","spec":{"max_price_per_hour":1,"bogus":1}}`, "unknown argument spec.bogus"},
	} {
		a := s.post("/api/v1/mcp", key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+tc.tool+`","arguments":`+tc.args+`}}`)
		res := a.result()
		content, _ := res["content"].([]any)
		if a.status != 200 || res["isError"] != true || len(content) == 0 {
			t.Errorf("%s %s: %d %s", tc.tool, tc.args, a.status, a.raw)
			continue
		}
		msg, _ := content[0].(map[string]any)["text"].(string)
		if !strings.Contains(msg, tc.want) || !strings.HasPrefix(msg, "invalid arguments for "+tc.tool+": ") {
			t.Errorf("%s %s:\n got %q\nwant %q", tc.tool, tc.args, msg, tc.want)
		}
		for _, internal := range []string{"reflect", "validating", "/properties", "0.000000", "-1/1"} {
			if strings.Contains(msg, internal) {
				t.Errorf("%s %s: %q shows %q", tc.tool, tc.args, msg, internal)
			}
		}
	}
}
