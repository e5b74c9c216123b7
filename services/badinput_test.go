package services_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestTokenPricedBadBodyOpenAIShape: on a token-priced service's
// endpoint, max_tokens 1e12, n 1e9 and max_tokens 2.5 are 400s in
// OpenAI's error shape naming the param and its range, refused before
// any admission: no 402 for a clamped reservation, no hold.
func TestTokenPricedBadBodyOpenAIShape(t *testing.T) {
	s := newStack(t, dbtest.SQLite, stackOpts{})
	s.create(`{"name":"priced","model":"p","spec":{"max_price_per_hour":1,"providers":"vast.ai","max_attempts":20},` +
		`"image":"img","port":8000,"token_price":{"input_per_1m":1,"output_per_1m":3}}`)
	s.waitReady("priced", 1, 20*time.Second)
	before, err := s.apps[0].Guard.Spending(context.Background(), s.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ body, param, want string }{
		{`{"model":"p","max_tokens":1e12,"messages":[]}`, "max_tokens", "must be an integer from 1 to 1000000, got 1e12"},
		{`{"model":"p","max_tokens":9,"n":1e9,"messages":[]}`, "n", "must be an integer from 1 to 128, got 1e9"},
		{`{"model":"p","max_tokens":2.5,"messages":[]}`, "max_tokens", "got 2.5"},
		{`{"model":"p","max_tokens":2147483648,"messages":[]}`, "max_tokens", "from 1 to 1000000"},
	} {
		status, body := s.post(0, "/v1/chat/completions", tc.body)
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Code    string  `json:"code"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || status != 400 || e.Error.Type != "invalid_request_error" ||
			e.Error.Param == nil || *e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s, want 400 invalid_request_error with param %s: …%s", tc.body, status, body, tc.param, tc.want)
		}
	}
	after, err := s.apps[0].Guard.Spending(context.Background(), s.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range after.Windows {
		// Metering may add to spent meanwhile; an admission would hold.
		if w.Held != before.Windows[i].Held {
			t.Fatalf("a refused body was admitted: before %+v, after %+v", before.Windows[i], w)
		}
	}
}
