package server_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/server"
)

// Money in request bodies follows gpuproxy.ParseUSD: more than six decimal
// places is refused with a message naming the field, never rounded.
func TestMoneyInput(t *testing.T) {
	e := newEnv(t, dbtest.SQLite, opts{})
	admin, _ := e.key("root", "admin")
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
		field                    string // the field named by a 400
		places                   bool   // the 400 says "at most 6 decimal places"
	}{
		{"check 7 places", "POST", "/api/v1/spending/check", `{"estimated_cost": 1.1234567}`, 400, "estimated_cost", true},
		{"check tiny", "POST", "/api/v1/spending/check", `{"estimated_cost": 0.0000001}`, 400, "estimated_cost", true},
		{"check exponent places", "POST", "/api/v1/spending/check", `{"estimated_cost": 15e-7}`, 400, "estimated_cost", true},
		{"check over max", "POST", "/api/v1/spending/check", `{"estimated_cost": 1000000000.000001}`, 400, "estimated_cost", false},
		{"check huge exponent", "POST", "/api/v1/spending/check", `{"estimated_cost": 1e99999999999}`, 400, "estimated_cost", false},
		{"check 6 places", "POST", "/api/v1/spending/check", `{"estimated_cost": 1.123456}`, 200, "", false},
		{"check exponent", "POST", "/api/v1/spending/check", `{"estimated_cost": 1e1}`, 200, "", false},
		{"check trailing zeros", "POST", "/api/v1/spending/check", `{"estimated_cost": 2.50000000}`, 200, "", false},
		{"check max", "POST", "/api/v1/spending/check", `{"estimated_cost": 1000000000}`, 200, "", false},
		{"credit 7 places", "POST", "/api/v1/billing/credits", `{"account":"root","amount":5.0000001}`, 400, "amount", true},
		{"credit over max", "POST", "/api/v1/billing/credits", `{"account":"root","amount":999999999999}`, 400, "amount", false},
		{"limit 7 places", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":50.1234567}]}`, 400, "windows[0].limit", true},
		{"limit -0 is 0", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":-0}]}`, 200, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, admin, tc.body, "Content-Type", "application/json")
			if r.Status != tc.want {
				t.Fatalf("status %d, want %d: %s", r.Status, tc.want, r.Body)
			}
			if tc.field == "" {
				return
			}
			var body struct {
				Error struct {
					Code    string         `json:"code"`
					Message string         `json:"message"`
					Details map[string]any `json:"details"`
				} `json:"error"`
			}
			_ = json.Unmarshal(r.Body, &body)
			if body.Error.Code != "invalid" || body.Error.Details["field"] != tc.field ||
				!strings.HasPrefix(body.Error.Message, tc.field+": ") {
				t.Fatalf("error does not name %q: %s", tc.field, r.Body)
			}
			if tc.places != strings.Contains(body.Error.Message, "at most 6 decimal places") {
				t.Fatalf("message %q (want the decimal places reason: %v)", body.Error.Message, tc.places)
			}
		})
	}
}

// The offer filter's max_price query parameter follows the same rules.
func TestOfferQueryMaxPrice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		want   int64
		places bool
		ok     bool
	}{
		{"2", 2_000_000, false, true},
		{"0.123456", 123_456, false, true},
		{"0.1234567", 0, true, false},
		{"1e-7", 0, true, false},
		{"abc", 0, false, false},
		{" 2", 0, false, false},
		{"+2", 0, false, false},
		{"1e12", 0, false, false},
		{"-1", 0, false, false},
	} {
		q, err := server.OfferQueryFrom(func(k string) string {
			if k == "max_price" {
				return tc.in
			}
			return ""
		})
		if (err == nil) != tc.ok || int64(q.MaxPrice) != tc.want && tc.ok {
			t.Errorf("max_price=%q: %d, %v", tc.in, q.MaxPrice, err)
			continue
		}
		if err != nil && (!strings.HasPrefix(err.Error(), "invalid: max_price: ") ||
			strings.Contains(err.Error(), "at most 6 decimal places") != tc.places) {
			t.Errorf("max_price=%q: error %v", tc.in, err)
		}
		// A number out of range is told the range, not that it is no number.
		if err != nil && strings.ContainsAny(tc.in, "e-") && !tc.places &&
			!strings.Contains(err.Error(), "must be between $0 and $1,000,000,000") {
			t.Errorf("max_price=%q: error %v, want the range", tc.in, err)
		}
	}
}

// An amount out of range says the range it must be in; only what is not a
// number is told it must be one.
func TestMoneyInputMessages(t *testing.T) {
	e := newEnv(t, dbtest.SQLite, opts{})
	admin, _ := e.key("root", "admin")
	const between, above = "must be between $0 and $1,000,000,000", "must be more than $0 and at most $1,000,000,000"
	for _, tc := range []struct {
		name, method, path, body, want string
	}{
		{"check 1e300", "POST", "/api/v1/spending/check", `{"estimated_cost": 1e300}`, "estimated_cost: " + between},
		{"check over max", "POST", "/api/v1/spending/check", `{"estimated_cost": 1000000000.000001}`, "estimated_cost: " + between},
		{"check negative", "POST", "/api/v1/spending/check", `{"estimated_cost": -1}`, "estimated_cost: " + between},
		{"check string", "POST", "/api/v1/spending/check", `{"estimated_cost": "25"}`, "estimated_cost: must be a number of US dollars"},
		{"credit over max", "POST", "/api/v1/billing/credits", `{"account":"root","amount":999999999999}`, "amount: " + above},
		{"credit zero", "POST", "/api/v1/billing/credits", `{"account":"root","amount":0}`, "amount: " + above},
		{"limit huge", "PUT", "/api/v1/accounts/root/limits", `{"windows":[{"window_minutes":60,"limit":1e12}]}`, "windows[0].limit: " + between},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, admin, tc.body, "Content-Type", "application/json")
			if code, msg := r.Err(t); r.Status != 400 || code != "invalid" || !strings.HasPrefix(msg, tc.want) {
				t.Fatalf("%d %s %q, want 400 invalid %q", r.Status, code, msg, tc.want)
			}
		})
	}
}
