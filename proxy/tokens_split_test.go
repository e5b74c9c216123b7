package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// collect is an h1client.Emitter that keeps what it gets.
type collect struct{ bytes.Buffer }

func (c *collect) Emit(p []byte) error { _, err := c.Write(p); return err }

// TestSSETapAtEverySplit feeds a stream to the tap in pieces of every
// size from 1 byte up (events split at every position): with drop, the
// output is the stream without its usage chunk (and without the
// "usage":null members), byte for byte; without drop, the stream itself;
// both read the model and the usage.
func TestSSETapAtEverySplit(t *testing.T) {
	ev := func(s string) string { return "data: " + s + "\n\n" }
	var with, without strings.Builder
	for _, w := range []string{"Hel", "lo", " world"} {
		c := fmt.Sprintf(`{"id":"x","model":"m-1","choices":[{"delta":{"content":%q}}]`, w)
		with.WriteString(ev(c + `,"usage":null}`))
		without.WriteString(ev(c + "}"))
	}
	with.WriteString(ev(`{"id":"x","model":"m-1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}`))
	with.WriteString("data: [DONE]\n\n")
	without.WriteString("data: [DONE]\n\n")
	in := with.String()
	for size := 1; size <= len(in); size++ {
		for _, drop := range []bool{true, false} {
			tap := &sseTap{drop: drop}
			var out collect
			for i := 0; i < len(in); i += size {
				if err := tap.Filter([]byte(in[i:min(i+size, len(in))]), &out); err != nil {
					t.Fatal(err)
				}
			}
			if err := tap.Flush(&out); err != nil {
				t.Fatal(err)
			}
			want := in
			if drop {
				want = without.String()
			}
			if out.String() != want {
				t.Fatalf("size %d drop %v: got\n%q\nwant\n%q", size, drop, out.String(), want)
			}
			if c := tap.counts(); !c.found || c.prompt != 7 || c.completion != 3 || c.model != "m-1" || c.content != 3 {
				t.Fatalf("size %d drop %v: counts %+v", size, drop, c)
			}
		}
	}
}

// TestSSETapPassesLongEvents: an event longer than maxHeldEvent is passed
// on as it comes (not held), whole and in order.
func TestSSETapPassesLongEvents(t *testing.T) {
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 3*maxHeldEvent) + "\"}}]}\n\n"
	in := long + "data: [DONE]\n\n"
	tap := &sseTap{drop: true}
	var out collect
	for i := 0; i < len(in); i += 4096 {
		if err := tap.Filter([]byte(in[i:min(i+4096, len(in))]), &out); err != nil {
			t.Fatal(err)
		}
	}
	if err := tap.Flush(&out); err != nil {
		t.Fatal(err)
	}
	if out.String() != in {
		t.Fatalf("long event changed: %d bytes out, %d in", out.Len(), len(in))
	}
	if cap(tap.held) > 4<<10 {
		t.Fatalf("the tap kept %d bytes after the long event", cap(tap.held))
	}
}

// TestJSONTap reads a long answer's model from its head and its usage
// from its tail, whatever the read sizes.
func TestJSONTap(t *testing.T) {
	body := `{"id":"a","model":"big-model","choices":[{"message":{"content":"` + strings.Repeat("y", 50_000) +
		`"}}],"usage":{"prompt_tokens":123,"completion_tokens":456,"total_tokens":579}}`
	for _, size := range []int{1, 7, 512, 4096, 100_000} {
		tap := &jsonTap{}
		var out collect
		for i := 0; i < len(body); i += size {
			_ = tap.Filter([]byte(body[i:min(i+size, len(body))]), &out)
		}
		_ = tap.Flush(&out)
		if c := tap.counts(); out.String() != body || !c.found || c.prompt != 123 || c.completion != 456 || c.model != "big-model" {
			t.Fatalf("size %d: %+v", size, c)
		}
	}
}

// TestAskUsage: a streamed request without include_usage asks for it,
// keeping its own bytes; one that asks, or is not streamed, is left.
func TestAskUsage(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, ""},
		{`{"model":"m","stream":false}`, ""},
		{`{"model":"m"}`, ""},
		{`not json "stream"`, ""},
	} {
		out, ok := askUsage([]byte(c.in))
		if c.want == "" {
			if ok || string(out) != c.in {
				t.Errorf("%s: changed to %s", c.in, out)
			}
			continue
		}
		if !ok || string(out) != c.want {
			t.Errorf("%s: got %s, want %s", c.in, out, c.want)
		}
	}
}

// BenchmarkJSONTap is the tap's cost on a small answer read in one piece
// (the proxy's hot path): no allocation.
func BenchmarkJSONTap(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-bench","object":"chat.completion","model":"bench","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,` +
		`"completion_tokens":1,"total_tokens":6}}`)
	var out discard
	b.ReportAllocs()
	for b.Loop() {
		t := newJSONTap()
		_ = t.Filter(body, out)
		_ = t.Flush(out)
		if c := t.counts(); c.prompt != 5 || c.model != "bench" {
			b.Fatal(c)
		}
		t.release()
	}
}

type discard struct{}

func (discard) Emit([]byte) error { return nil }
