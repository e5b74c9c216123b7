// Package jsonlog is slog's JSON handler with a fast path for flat lines.
// Every record goes through slog.JSONHandler as before; Handler.Flat
// writes a line of string and integer attributes (the request log's
// shape) with a hand-rolled appender into a pooled buffer, the bytes
// slog.JSONHandler would write for the same record (a differential test
// holds them equal), without the record, the handler state and the
// generic attribute walk per line.
package jsonlog

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Handler is a slog.Handler writing JSON lines to one writer, as
// slog.NewJSONHandler does, plus Flat. Lines are written whole, one Write
// each, under one lock whichever path wrote them.
type Handler struct {
	json  slog.Handler
	out   *lockedWriter
	level slog.Leveler
	// fast is false when the options change how a line is written
	// (ReplaceAttr, AddSource): Flat then goes through json.
	fast bool
}

// lockedWriter serializes writes of both paths to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// New returns a Handler writing to w with opts (nil for slog's defaults),
// as slog.NewJSONHandler(w, opts) does.
func New(w io.Writer, opts *slog.HandlerOptions) *Handler {
	var o slog.HandlerOptions
	if opts != nil {
		o = *opts
	}
	out := &lockedWriter{w: w}
	h := &Handler{json: slog.NewJSONHandler(out, &o), out: out, level: o.Level,
		fast: o.ReplaceAttr == nil && !o.AddSource}
	if h.level == nil {
		h.level = slog.LevelInfo
	}
	return h
}

// Enabled reports whether lines at l are written.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.json.Enabled(ctx, l) }

// Handle writes r as slog.JSONHandler does.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error { return h.json.Handle(ctx, r) }

// WithAttrs returns slog.JSONHandler's handler with attrs (it has no Flat).
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler { return h.json.WithAttrs(attrs) }

// WithGroup returns slog.JSONHandler's handler in group name (it has no
// Flat).
func (h *Handler) WithGroup(name string) slog.Handler { return h.json.WithGroup(name) }

// Flat writes one line at t and level l with message msg and attrs, in
// order, when l is enabled: the bytes Handle writes for the same record.
// attrs of a kind other than string or integer (or with an empty key),
// and options that change a line, take slog's path.
func (h *Handler) Flat(ctx context.Context, t time.Time, l slog.Level, msg string, attrs ...slog.Attr) error {
	if l < h.level.Level() {
		return nil
	}
	if !h.fast || !flat(attrs) || t.IsZero() || t.Year() < 0 || t.Year() >= 10000 {
		r := slog.NewRecord(t, l, msg, 0)
		r.AddAttrs(attrs...)
		return h.json.Handle(ctx, r)
	}
	bp := bufs.Get().(*[]byte)
	b := appendLine((*bp)[:0], t, l, msg, attrs)
	_, err := h.out.Write(b)
	if cap(b) <= maxPooled {
		*bp = b
		bufs.Put(bp)
	}
	return err
}

// maxPooled is the largest line buffer kept for reuse (slog keeps up to
// 16 KiB too): one huge line does not pin its buffer.
const maxPooled = 16 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// flat reports whether every attr is a string or an integer under a
// non-empty key, the kinds appendLine writes.
func flat(attrs []slog.Attr) bool {
	for _, a := range attrs {
		if a.Key == "" {
			return false
		}
		switch a.Value.Kind() {
		case slog.KindString, slog.KindInt64:
		default:
			return false
		}
	}
	return true
}

// appendLine appends the JSON line slog.JSONHandler writes for the
// record: time (RFC 3339 with nanoseconds, monotonic reading dropped),
// level, message, then attrs, and a newline.
func appendLine(b []byte, t time.Time, l slog.Level, msg string, attrs []slog.Attr) []byte {
	b = append(b, `{"time":"`...)
	b = t.Round(0).AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"`...)
	b = appendString(b, l.String())
	b = append(b, `","msg":"`...)
	b = appendString(b, msg)
	b = append(b, '"')
	for _, a := range attrs {
		b = append(b, ',', '"')
		b = appendString(b, a.Key)
		b = append(b, '"', ':')
		if a.Value.Kind() == slog.KindInt64 {
			b = strconv.AppendInt(b, a.Value.Int64(), 10)
			continue
		}
		b = append(b, '"')
		b = appendString(b, a.Value.String())
		b = append(b, '"')
	}
	return append(b, '}', '\n')
}

const hex = "0123456789abcdef"

// safe holds true for the bytes appendString copies as they are:
// printable ASCII but '"' and '\\' (slog's safeSet; DEL included).
var safe = func() (t [256]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString appends s escaped as slog's JSON handler escapes strings
// (its appendEscapedJSONString): '"', '\\' and control characters
// escaped, invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped, HTML
// characters kept.
func appendString(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		for i < len(s) && safe[s[i]] {
			i++ // the common case: a run of printable ASCII, copied whole
		}
		if i == len(s) {
			break
		}
		if c := s[i]; c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			b = append(b, '\\')
			switch c {
			case '\\', '"':
				b = append(b, c)
			case '\n':
				b = append(b, 'n')
			case '\r':
				b = append(b, 'r')
			case '\t':
				b = append(b, 't')
			default:
				b = append(b, 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, `\u202`...)
			b = append(b, hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
}
