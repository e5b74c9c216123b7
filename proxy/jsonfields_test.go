package proxy

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzTopFields holds the hand-written field reader to encoding/json,
// which it replaces on the hot path: for any body, a priced request's
// fields and a stream's read the same way (accepted or refused alike,
// the same raw values), and topFields accepts no body json.Unmarshal
// refuses.
func FuzzTopFields(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`,
		`{"max_tokens": 16 , "n":2,"max_completion_tokens":null}`,
		`{"MAX_TOKENS":5,"max_tokens":7}`,
		`{"max_tokens":5,"Max_Tokens":7,"stream":true,"stream_options":{"include_usage":false}}`,
		`{"stream":"yes"}`, `{"stream":null,"stream":true}`, `{"stream":1}`,
		`{"a":{"max_tokens":1},"b":["max_tokens",{"n":3}],"c":"\"max_tokens\":9"}`,
		`{"max_to\u006bens":3}`, `{"max_toKens":3}`, "{\"max_to\u212aens\":3}",
		`null`, ` null `, `[]`, `"x"`, `1`, `{}`, ` { } `, `{"max_tokens":1}x`, `{"max_tokens":}`,
		`{"n":-1}`, `{"n":1.5}`, `{"n":1e2}`, `{"max_tokens":"12"}`, "{\"x\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast, slow pricedBody
		fastOK := fast.read(body)
		slowOK := json.Unmarshal(body, &slow) == nil
		if fastOK != slowOK {
			t.Fatalf("priced %q: read %v, json %v", body, fastOK, slowOK)
		}
		if fastOK && (!bytes.Equal(fast.MaxTokens, slow.MaxTokens) || !bytes.Equal(fast.N, slow.N) ||
			!bytes.Equal(fast.MaxCompletionTokens, slow.MaxCompletionTokens)) {
			t.Fatalf("priced %q: read %+v, json %+v", body, fast, slow)
		}
		var fs, ss streamRequest
		fsOK := fs.read(body)
		ssOK := json.Unmarshal(body, &ss) == nil
		if fsOK != ssOK {
			t.Fatalf("stream %q: read %v, json %v", body, fsOK, ssOK)
		}
		if fsOK && (fs.Stream != ss.Stream || !bytes.Equal(fs.StreamOptions, ss.StreamOptions)) {
			t.Fatalf("stream %q: read %+v, json %+v", body, fs, ss)
		}
		if topFields(body, func(_, _ []byte) {}) {
			var v any
			if json.Unmarshal(body, &v) != nil {
				t.Fatalf("topFields accepted %q, which json refuses", body)
			}
		}
	})
}

// TestTopFieldsAllocatesNothing: reading a priced body's fields costs no
// allocation (the reason topFields exists).
func TestTopFieldsAllocatesNothing(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}`)
	var b pricedBody
	var s streamRequest
	b.read(body) // warm json.Valid's scanner pool
	if n := testing.AllocsPerRun(100, func() {
		b.read(body)
		s.read(body)
		if _, err := pricedField("max_tokens", b.MaxTokens); err != nil {
			t.Fatal(err)
		}
	}); n != 0 && !raceEnabled {
		t.Fatalf("%v allocations reading the fields, want 0", n)
	}
	if string(b.MaxTokens) != "64" || !s.Stream {
		t.Fatalf("read %+v %+v", b, s)
	}
}
