package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/h1client"
)

// Token accounting: the usage record of an OpenAI-compatible answer gets
// its model and token counts, read from the answer as it passes — a JSON
// body's "usage" object, or a stream's usage chunk — without holding the
// answer back. When a streamed request did not ask for usage and
// Options.StreamUsage is "add", the request asks for it
// (stream_options.include_usage) and the tap takes the usage chunk out of
// what the caller receives, so the caller gets exactly the stream it
// asked for: each event is passed on whole once its end is seen (an
// event split across reads waits for its end; one longer than
// maxHeldEvent is passed on as it comes).

// StreamUsage settings (Options.StreamUsage).
const (
	StreamUsageAdd = "add" // ask for a stream's usage and keep it from the caller
	StreamUsageOff = "off" // read a stream's usage only when the caller asked for it
)

// maxHeldEvent bounds the bytes of one server-sent event a tap holds (or
// copies, to read it) while its end has not come.
const maxHeldEvent = 16 << 10

// jsonHead and jsonTail bound what a tap keeps of a JSON answer: its
// first bytes (the model), and its last (the usage object, which
// OpenAI-compatible servers put at the end).
const (
	jsonHead = 2 << 10
	jsonTail = 4 << 10
)

// tokenCounts is what a tap found.
type tokenCounts struct {
	model      string
	prompt     int64
	completion int64
	found      bool  // a usage object was read
	content    int64 // stream events that carried content (a cut stream's delivered tokens)
}

// answerUsage is the part of an answer or a chunk a tap reads.
type answerUsage struct {
	Model   string            `json:"model"`
	Choices []json.RawMessage `json:"choices"`
	Usage   *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// sseTap reads a token stream's usage as it is relayed and, with drop,
// takes the usage-only chunk (and the "usage":null members the option
// adds to the others) out of it.
type sseTap struct {
	tokenCounts
	drop       bool
	held       []byte // the current event's bytes so far (drop: not yet passed on)
	overflow   bool   // the current event passed maxHeldEvent: passed on as it comes, not read
	modelTried bool   // the first data event was read for its model
	stripped   []byte // stripUsageNull's output, reused
}

var (
	eventEnd    = []byte("\n\n")
	eventEndCR  = []byte("\n\r\n")
	dataPrefix  = []byte("data:")
	usageObject = []byte(`"usage":{`)
	usageNull   = []byte(`,"usage":null`)
	contentKey  = []byte(`"content":"`)
	emptyDelta  = []byte(`"content":""`)
)

// Filter (h1client.Filter) takes the next bytes of the stream and passes on, through e,
// what the caller gets now: p itself, unless drop holds or removes
// something (then the kept parts, in order). e must use its bytes
// before it returns.
func (t *sseTap) Filter(p []byte, e h1client.Emitter) error {
	if !t.drop {
		t.observe(p)
		return e.Emit(p)
	}
	keep, at := 0, 0 // p[keep:at] is kept and not emitted yet
	for at < len(p) {
		end := t.eventEnd(p[at:])
		if end < 0 {
			if t.overflow || len(t.held)+len(p)-at > maxHeldEvent {
				// Too long to hold: passed on as it comes, not read.
				if len(t.held) > 0 { // then at == 0: p continues it
					if err := e.Emit(t.held); err != nil {
						return err
					}
					t.resetHeld()
				}
				t.overflow = true
				return e.Emit(p[keep:])
			}
			if err := emitSome(p[keep:at], e); err != nil {
				return err
			}
			t.held = append(t.held, p[at:]...)
			return nil
		}
		ev := p[at : at+end]
		switch {
		case t.overflow: // the end of an event passed on as it came
			t.overflow = false
			at += end
		case len(t.held) > 0: // the end of a held event (at == keep == 0)
			t.held = append(t.held, ev...)
			if t.event(t.held) {
				if err := e.Emit(t.stripUsageNull(t.held)); err != nil {
					return err
				}
			}
			t.resetHeld()
			at += end
			keep = at
		default:
			kept := t.event(ev)
			if kept && !bytes.Contains(ev, usageNull) {
				at += end
				continue
			}
			if err := emitSome(p[keep:at], e); err != nil {
				return err
			}
			if kept {
				if err := e.Emit(t.stripUsageNull(ev)); err != nil {
					return err
				}
			}
			at += end
			keep = at
		}
	}
	return emitSome(p[keep:at], e)
}

// observe reads the events in p without changing the stream: an event
// split across reads is copied (up to maxHeldEvent) to be read whole.
func (t *sseTap) observe(p []byte) {
	for len(p) > 0 {
		end := t.eventEnd(p)
		if end < 0 {
			if !t.overflow && len(t.held)+len(p) <= maxHeldEvent {
				t.held = append(t.held, p...)
			} else {
				t.resetHeld()
				t.overflow = true
			}
			return
		}
		ev := p[:end]
		p = p[end:]
		switch {
		case t.overflow:
			t.overflow = false
		case len(t.held) > 0:
			t.held = append(t.held, ev...)
			t.event(t.held)
			t.resetHeld()
		default:
			t.event(ev)
		}
	}
}

// resetHeld empties the held bytes, letting a large buffer go.
func (t *sseTap) resetHeld() {
	if cap(t.held) > 4<<10 {
		t.held = nil
		return
	}
	t.held = t.held[:0]
}

func emitSome(b []byte, e h1client.Emitter) error {
	if len(b) == 0 {
		return nil
	}
	return e.Emit(b)
}

// stripUsageNull takes out the "usage":null member the usage option adds
// to a stream's other chunks, into a buffer the tap reuses (valid until
// the next call: an Emitter uses its bytes before it returns).
func (t *sseTap) stripUsageNull(ev []byte) []byte {
	if !bytes.Contains(ev, usageNull) {
		return ev
	}
	out := t.stripped[:0]
	for {
		i := bytes.Index(ev, usageNull)
		if i < 0 {
			break
		}
		out = append(out, ev[:i]...)
		ev = ev[i+len(usageNull):]
	}
	out = append(out, ev...)
	if cap(out) <= 4<<10 { // a large event's buffer is let go, as held's
		t.stripped = out
	}
	return out
}

// eventEnd returns the index in p just past the blank line that ends the
// current event, or -1.
func (t *sseTap) eventEnd(p []byte) int {
	if n := len(t.held); n > 0 && t.held[n-1] == '\n' {
		switch {
		case p[0] == '\n':
			return 1
		case len(p) > 1 && p[0] == '\r' && p[1] == '\n':
			return 2
		}
	}
	i, j := bytes.Index(p, eventEnd), bytes.Index(p, eventEndCR)
	switch {
	case i >= 0 && (j < 0 || i <= j):
		return i + 2
	case j >= 0:
		return j + 3
	}
	return -1
}

// event reads one whole event and reports whether it is passed on (not
// the usage-only chunk of a stream whose usage we asked for).
func (t *sseTap) event(ev []byte) bool {
	data := ev
	if i := bytes.Index(data, dataPrefix); i >= 0 {
		data = bytes.TrimSpace(data[i+len(dataPrefix):])
	} else {
		return true
	}
	if len(data) == 0 || data[0] != '{' {
		return true // [DONE], comments
	}
	if bytes.Contains(data, contentKey) && !bytes.Contains(data, emptyDelta) {
		t.content++
	}
	if !t.modelTried { // the first chunk names the model (every chunk does)
		t.modelTried = true
		t.model = stringField(data, `"model"`)
	}
	if !bytes.Contains(data, usageObject) {
		return true
	}
	var a answerUsage
	if json.Unmarshal(data, &a) != nil {
		return true
	}
	if t.model == "" {
		t.model = a.Model
	}
	if a.Usage != nil {
		t.prompt, t.completion, t.found = a.Usage.PromptTokens, a.Usage.CompletionTokens, true
		if t.drop && len(a.Choices) == 0 {
			return false
		}
	}
	return true
}

// Flush (h1client.Filter) passes on what is still held at the stream's end (an event
// without its blank line).
func (t *sseTap) Flush(e h1client.Emitter) error {
	if len(t.held) == 0 {
		return nil
	}
	held := t.held
	t.held = nil
	if t.event(held) && t.drop {
		return e.Emit(t.stripUsageNull(held))
	}
	return nil
}

// jsonTap keeps a JSON answer's first and last bytes, to read its model
// and usage at the end. Its buffers are fixed (taps are pooled: a plain
// answer costs no allocation).
type jsonTap struct {
	tokenCounts
	head  [jsonHead]byte
	nhead int
	tail  [jsonTail]byte // a ring of the last bytes
	ntail int            // bytes written to the ring in all
}

var jsonTaps = sync.Pool{New: func() any { return new(jsonTap) }}

func newJSONTap() *jsonTap {
	t := jsonTaps.Get().(*jsonTap)
	t.tokenCounts, t.nhead, t.ntail = tokenCounts{}, 0, 0
	return t
}

// release returns t to the pool (after its counts were read).
func (t *jsonTap) release() { jsonTaps.Put(t) }

func (t *jsonTap) observe(p []byte) {
	if t.nhead < jsonHead {
		t.nhead += copy(t.head[t.nhead:], p)
	}
	if len(p) > jsonTail {
		p = p[len(p)-jsonTail:]
	}
	for len(p) > 0 {
		at := t.ntail % jsonTail
		n := copy(t.tail[at:], p)
		t.ntail += n
		p = p[n:]
	}
}

// tailBytes returns the ring's bytes in order (a copy only when the ring
// wrapped).
func (t *jsonTap) tailBytes() []byte {
	if t.ntail <= jsonTail {
		return t.tail[:t.ntail]
	}
	at := t.ntail % jsonTail
	out := make([]byte, 0, jsonTail)
	out = append(out, t.tail[at:]...)
	return append(out, t.tail[:at]...)
}

// end reads the model from the head and the usage from the tail.
func (t *jsonTap) end() {
	if m := stringField(t.head[:t.nhead], `"model"`); m != "" {
		t.model = m
	}
	tail := t.tailBytes()
	i := bytes.LastIndex(tail, []byte(`"usage"`))
	if i < 0 {
		return
	}
	obj := tail[i+len(`"usage"`):]
	if end := bytes.IndexByte(obj, '}'); end >= 0 {
		obj = obj[:end]
	}
	prompt, ok1 := intField(obj, `"prompt_tokens"`)
	completion, ok2 := intField(obj, `"completion_tokens"`)
	if ok1 || ok2 {
		t.prompt, t.completion, t.found = prompt, completion, true
	}
}

// intField reads the non-negative integer value of key in b.
func intField(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return 0, false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	var n int64
	digits := 0
	for _, c := range rest {
		if c < '0' || c > '9' || digits > 15 {
			break
		}
		n = n*10 + int64(c-'0')
		digits++
	}
	return n, digits > 0
}

// lastModel is the model string stringField returned last: answers name
// the same model over and over, and reusing its string saves a copy per
// answer.
var lastModel atomic.Pointer[string]

// internModel returns v as a string, lastModel's when it is the same.
func internModel(v []byte) string {
	if m := lastModel.Load(); m != nil && *m == string(v) {
		return *m
	}
	m := string(v)
	lastModel.Store(&m)
	return m
}

// stringField reads the string value of the first key in b (a JSON
// object's start), or "".
func stringField(b []byte, key string) string {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return ""
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return ""
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return ""
	}
	if v := rest[1 : 1+end]; bytes.IndexByte(v, '\\') < 0 {
		return internModel(v)
	}
	var s string // escapes: let the JSON decoder read it
	if json.NewDecoder(bytes.NewReader(rest)).Decode(&s) != nil {
		return ""
	}
	return s
}

// streamRequest is the part of a request body streamUsage reads.
type streamRequest struct {
	Stream        bool            `json:"stream"`
	StreamOptions json.RawMessage `json:"stream_options"`
}

// read reads the body's fields: without allocating when topFields can,
// else with encoding/json; false when the body is not a JSON object (or
// null) or its stream is not a boolean.
func (r *streamRequest) read(body []byte) bool {
	bad := false
	if topFields(body, func(k, v []byte) {
		switch {
		case fieldIs(k, "stream"):
			switch string(v) {
			case "true":
				r.Stream = true
			case "false":
				r.Stream = false
			case "null":
			default:
				bad = true
			}
		case fieldIs(k, "stream_options"):
			r.StreamOptions = v
		}
	}) {
		return !bad
	}
	var slow streamRequest // on the heap only on this path
	ok := json.Unmarshal(body, &slow) == nil
	*r = slow
	return ok
}

// askUsage returns body asking for the stream's usage when it is a
// streamed request that does not (and true), or body unchanged (false).
func askUsage(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"stream"`)) {
		return body, false
	}
	var r streamRequest
	if !r.read(body) || !r.Stream {
		return body, false
	}
	opts := map[string]json.RawMessage{}
	if len(r.StreamOptions) > 0 && string(r.StreamOptions) != "null" {
		if json.Unmarshal(r.StreamOptions, &opts) != nil {
			return body, false
		}
		if v, ok := opts["include_usage"]; ok && strings.TrimSpace(string(v)) == "true" {
			return body, false // the caller asked: it gets the chunk
		}
	}
	if len(r.StreamOptions) == 0 {
		// Appended before the closing brace: the caller's bytes stay as
		// they were.
		end := bytes.LastIndexByte(body, '}')
		if end < 0 {
			return body, false
		}
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:end]...)
		out = append(out, `,"stream_options":{"include_usage":true}`...)
		return append(out, body[end:]...), true
	}
	opts["include_usage"] = json.RawMessage("true")
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return body, false
	}
	m["stream_options"], _ = json.Marshal(opts)
	out, err := json.Marshal(m)
	if err != nil {
		return body, false
	}
	return out, true
}

// answerTap reads an answer's model and tokens as it is relayed
// (h1client.Filter: the detached stream's relay and copyBody both run
// it).
type answerTap interface {
	h1client.Filter
	counts() tokenCounts
	// reframes reports whether the tap may change the answer's length
	// (it takes events out).
	reframes() bool
}

func (t *sseTap) reframes() bool  { return t.drop }
func (t *jsonTap) reframes() bool { return false }

func (t *sseTap) counts() tokenCounts { return t.tokenCounts }

// Filter (h1client.Filter) observes a JSON answer and passes it on.
func (t *jsonTap) Filter(p []byte, e h1client.Emitter) error {
	t.observe(p)
	return e.Emit(p)
}

// Flush (h1client.Filter) reads what the answer held.
func (t *jsonTap) Flush(h1client.Emitter) error {
	t.end()
	return nil
}

func (t *jsonTap) counts() tokenCounts { return t.tokenCounts }

// newTap returns the tap for an answer to a POST (nil for another
// method, a non-2xx answer, or one neither JSON nor an event stream);
// added tells that the request's stream usage was asked for by us.
func newTap(method string, resp *http.Response, added bool) answerTap {
	if method != http.MethodPost || resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil
	}
	if isEventStream(resp.Header) {
		return &sseTap{drop: added}
	}
	ct := resp.Header["Content-Type"]
	if len(ct) > 0 && strings.HasPrefix(ct[0], "application/json") {
		return newJSONTap()
	}
	return nil
}

// applyTap records what t found on u: the usage's tokens or, for a
// stream cut before its usage chunk, the content events delivered as
// completion tokens; the answer's model when u has none.
func applyTap(u *gpuproxy.Usage, t answerTap) {
	if t == nil {
		return
	}
	c := t.counts()
	switch {
	case c.found:
		u.PromptTokens, u.CompletionTokens = c.prompt, c.completion
	case c.content > 0:
		u.CompletionTokens = c.content
	}
	if u.Model == "" {
		u.Model = truncate(c.model, 200)
	}
	if j, ok := t.(*jsonTap); ok {
		j.release()
	}
}

// writerEmitter passes a filter's output to the caller (copyBody's
// h1client.Emitter), bounded by MaxResponseBody.
type writerEmitter struct {
	w       http.ResponseWriter
	written int64
	max     int64
}

func (we *writerEmitter) Emit(b []byte) error {
	if we.written+int64(len(b)) > we.max {
		return errResponseTooLarge
	}
	m, err := we.w.Write(b)
	we.written += int64(m)
	if err != nil {
		return h1client.ErrClientGone
	}
	return nil
}
