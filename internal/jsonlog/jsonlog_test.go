package jsonlog

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"
)

// slogLine is what slog.JSONHandler writes for the record.
func slogLine(t *testing.T, opts *slog.HandlerOptions, at time.Time, l slog.Level, msg string, attrs []slog.Attr) string {
	t.Helper()
	var b bytes.Buffer
	r := slog.NewRecord(at, l, msg, 0)
	r.AddAttrs(attrs...)
	h := slog.NewJSONHandler(&b, opts)
	if h.Enabled(context.Background(), l) {
		if err := h.Handle(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// flatLine is what Flat writes for the record.
func flatLine(t *testing.T, opts *slog.HandlerOptions, at time.Time, l slog.Level, msg string, attrs []slog.Attr) string {
	t.Helper()
	var b bytes.Buffer
	if err := New(&b, opts).Flat(context.Background(), at, l, msg, attrs...); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// odd are strings slog escapes (or keeps) in its own way.
var odd = []string{
	"", "plain", `quote " and \ backslash`, "new\nline\r\ttab", "\x00\x01\x1f\x7f",
	"<script>&amp;</script>", "\xff\xfe invalid", "trunc \xe2\x82", "é ü 日本 🎉",
	"\u2028 line \u2029 para", "\ufffd", "/v1/chat/completions?x=1", "a\u0085b",
}

func TestFlatIsSlogsJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 28, 6, 31, 13, 120034005, time.UTC)
	local := time.Date(2026, 3, 1, 0, 0, 0, 0, time.FixedZone("X", -(3*3600+30*60)))
	request := []slog.Attr{slog.String("request_id", "gp_123"), slog.String("method", "POST"),
		slog.String("route", "/api/v1/proxy/:id/*"), slog.Int("status", 200),
		slog.Int64("duration_us", 1234), slog.Int64("bytes_out", -5),
		slog.String("account", "acme"), slog.String("key_id", "key_9")}
	cases := []struct {
		name  string
		opts  *slog.HandlerOptions
		at    time.Time
		level slog.Level
		msg   string
		attrs []slog.Attr
	}{
		{"request", nil, at, slog.LevelInfo, "request", request},
		{"error level", nil, at, slog.LevelError, "request", request[:6]},
		{"odd level", nil, at, slog.LevelWarn + 2, "m", nil},
		{"below level", &slog.HandlerOptions{Level: slog.LevelWarn}, at, slog.LevelInfo, "request", request},
		{"monotonic clock", nil, time.Now(), slog.LevelInfo, "request", request},
		{"whole second", nil, at.Truncate(time.Second), slog.LevelInfo, "request", request},
		{"offset zone", nil, local, slog.LevelDebug - 1, "x", request},
		{"zero time", nil, time.Time{}, slog.LevelInfo, "request", request},
		{"year 10000", nil, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), slog.LevelInfo, "r", nil},
		{"other kinds", nil, at, slog.LevelInfo, "r", []slog.Attr{slog.Bool("ok", true), slog.Duration("d", time.Second)}},
		{"empty key", nil, at, slog.LevelInfo, "r", []slog.Attr{slog.String("", "v"), slog.Int("", 0)}},
		{"replace attr", &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			a.Key = strings.ToUpper(a.Key)
			return a
		}}, at, slog.LevelInfo, "request", request},
		{"add source", &slog.HandlerOptions{AddSource: true}, at, slog.LevelInfo, "request", request},
	}
	for i, s := range odd {
		cases = append(cases, struct {
			name  string
			opts  *slog.HandlerOptions
			at    time.Time
			level slog.Level
			msg   string
			attrs []slog.Attr
		}{"odd string " + string(rune('a'+i)), nil, at, slog.LevelInfo, s,
			[]slog.Attr{slog.String(s+"k", s), slog.String("route", s), slog.Int64(s+"n", -1<<63)}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			want := slogLine(t, c.opts, c.at, c.level, c.msg, c.attrs)
			if got := flatLine(t, c.opts, c.at, c.level, c.msg, c.attrs); got != want {
				t.Errorf("Flat wrote\n%q\nslog.JSONHandler writes\n%q", got, want)
			}
		})
	}
}

// FuzzFlatIsSlogsJSON: whatever the strings, integers, time and level,
// Flat writes the bytes slog.JSONHandler writes.
func FuzzFlatIsSlogsJSON(f *testing.F) {
	for _, s := range odd {
		f.Add(s, s, s, int64(-1), int64(1764311473120034005), 0)
	}
	f.Fuzz(func(t *testing.T, msg, key, val string, n, ns int64, lvl int) {
		at := time.Unix(0, ns).In(time.FixedZone("", int(n%(14*3600))))
		attrs := []slog.Attr{slog.String(key, val), slog.Int64("n", n), slog.String("v", val), slog.Int(key+"i", int(ns))}
		want := slogLine(t, nil, at, slog.Level(lvl), msg, attrs)
		if got := flatLine(t, nil, at, slog.Level(lvl), msg, attrs); got != want {
			t.Errorf("Flat wrote\n%q\nslog.JSONHandler writes\n%q", got, want)
		}
	})
}

// TestHandleIsSlogsJSON: records that do not go through Flat are
// slog.JSONHandler's lines, derived handlers included.
func TestHandleIsSlogsJSON(t *testing.T) {
	t.Parallel()
	var got, want bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	for _, l := range []*slog.Logger{slog.New(New(&got, opts)), slog.New(slog.NewJSONHandler(&want, opts))} {
		l.Debug("hello", "err", "x\"y", "n", 3, "d", time.Second)
		l.With("a", 1).WithGroup("g").Info("in group", "k", "v")
	}
	// The lines differ in their times only.
	stamp := regexp.MustCompile(`"time":"[^"]*"`)
	g, w := stamp.ReplaceAllString(got.String(), `"time":""`), stamp.ReplaceAllString(want.String(), `"time":""`)
	if g != w || !strings.Contains(w, `"g":{"k":"v"}`) {
		t.Errorf("Handle wrote\n%s\nslog.JSONHandler writes\n%s", g, w)
	}
}

// TestFlatAllocatesNothing: a line through Flat costs no allocation once
// the buffer pool is warm.
func TestFlatAllocatesNothing(t *testing.T) {
	var b bytes.Buffer
	b.Grow(1 << 20)
	h := New(&b, nil)
	at := time.Now()
	ctx := context.Background()
	n := testing.AllocsPerRun(100, func() {
		_ = h.Flat(ctx, at, slog.LevelInfo, "request", slog.String("request_id", "gp_1"),
			slog.String("method", "GET"), slog.Int("status", 200), slog.Int64("bytes_out", 17))
	})
	if n != 0 {
		t.Errorf("Flat: %v allocations per line, want 0", n)
	}
}

func BenchmarkRequestLine(b *testing.B) {
	at := time.Now()
	ctx := context.Background()
	attrs := []slog.Attr{slog.String("request_id", "gp_0123456789abcdef"), slog.String("method", "POST"),
		slog.String("route", "/api/v1/proxy/:id/*"), slog.Int("status", 200),
		slog.Int64("duration_us", 1234), slog.Int64("bytes_out", 5120),
		slog.String("account", "acme"), slog.String("key_id", "key_9")}
	b.Run("slog", func(b *testing.B) {
		h := slog.NewJSONHandler(discard{}, nil)
		b.ReportAllocs()
		for b.Loop() {
			r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
			r.AddAttrs(attrs...)
			_ = h.Handle(ctx, r)
		}
	})
	b.Run("flat", func(b *testing.B) {
		h := New(discard{}, nil)
		b.ReportAllocs()
		for b.Loop() {
			_ = h.Flat(ctx, at, slog.LevelInfo, "request", attrs...)
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
