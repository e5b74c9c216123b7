package proxy

import (
	"encoding/json"
	"testing"
)

// FuzzModelOnly holds the service endpoint's read of a body's model and
// messages to encoding/json, which it replaces when it can: for any body,
// the same error (or none), the same model and the same kind of messages.
func FuzzModelOnly(f *testing.F) {
	for _, s := range []string{
		`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`,
		`{"model":"m"}`, `{"model":""}`, `{"model":null}`, `{"model":"a","model":null}`, `{"model":null,"model":"b"}`,
		`{"MODEL":"a","model":"b"}`, `{"Model":"a"}`, `{"model":1}`, `{"model":true}`, `{"model":{"x":1}}`,
		`{"model":["a"]}`, `{"model":"a\"b"}`, `{"model":"\u006d"}`, `{"model":"é"}`, "{\"model\":\"\xff\"}",
		`{"mod\u0065l":"x"}`, `{"meſſages":[]}`, `{"model":"m","messages":null}`, `{"model":"m","messages":"x"}`,
		`{"model":"m","messages":{}}`, `{"messages":[],"messages":null}`, `{"model":"m","messages":3}`,
		`null`, `[]`, `"x"`, `1`, `{}`, `{"model":"m"}x`, `{"model":}`, ``, ` `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast, slow modelOnly
		ferr := fast.read(body)
		serr := json.Unmarshal(body, &slow)
		if (ferr == nil) != (serr == nil) || ferr != nil && ferr.Error() != serr.Error() {
			t.Fatalf("%q: read's error %v, json's %v", body, ferr, serr)
		}
		if ferr != nil {
			return
		}
		if (fast.Model == nil) != (slow.Model == nil) || fast.Model != nil && *fast.Model != *slow.Model ||
			fast.Messages != slow.Messages {
			t.Fatalf("%q: read %s %q, json %s %q", body, show(fast.Model), fast.Messages, show(slow.Model), slow.Messages)
		}
	})
}

func show(s *string) string {
	if s == nil {
		return "no model"
	}
	return "model " + *s
}
