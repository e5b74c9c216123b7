package takeover

import (
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// parseHead parses a request head, through its blank line, into the
// request that http.ReadRequest returns for it, when net/http's server
// would accept that request and this loop serves it: HTTP/1.1, a target
// in origin form, one valid Host, a Content-Length or none, and no
// Transfer-Encoding, Expect, Upgrade or Connection other than keep-alive.
// It returns nil for anything else, and for anything it does not parse
// the way ReadRequest does (obs-fold, bare CR or LF, whitespace before a
// colon, repeated Content-Length, ...): such a head goes back to
// net/http, which serves or refuses it. The request's Body is
// http.NoBody; serveOne gives it its own.
//
// The head is copied into one string, which its fields are sliced from;
// the request, its URL and the header values' slices are one allocation
// (newParsedHead); the header map is made for its keys (two allocations
// for up to 8, four for more).
// FuzzHeadParse proves it against http.ReadRequest.
func parseHead(head []byte) *http.Request {
	if len(head) < len("\r\n\r\n") || string(head[len(head)-4:]) != "\r\n\r\n" {
		return nil
	}
	s := string(head)
	line, rest, ok := h1.NextLine(s)
	if !ok {
		return nil
	}
	method, target, ok := requestLine(line)
	if !ok {
		return nil
	}
	lines := strings.Count(rest, "\r\n") - 1 // header lines, the blank one aside
	req, u, vals := newParsedHead(lines)
	if u = parseTarget(target, u); u == nil {
		return nil
	}
	h := make(http.Header, max(lines-1, 0)) // Host is not kept
	f, ok := readFields(rest, h, vals)
	if !ok {
		return nil
	}
	*req = http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: http.NoBody, ContentLength: f.cl, Host: f.host, RequestURI: target}
	return req
}

// readFields reads the header lines in rest, through the blank line that
// ends it, into h, slicing each key's values from vals (room for one value
// per line), and returns what it noted of them; false when the head goes
// back to net/http.
func readFields(rest string, h http.Header, vals []string) (f headFields, ok bool) {
	for {
		var line string
		if line, rest, ok = h1.NextLine(rest); !ok {
			return f, false
		}
		if line == "" {
			break
		}
		key, value, ok := h1.HeaderField(line)
		if !ok || !f.note(key, value) {
			return f, false
		}
		if key == "Host" {
			continue // net/http's server takes it out of the header
		}
		if vv := h[key]; vv != nil {
			h[key] = append(vv, value)
		} else {
			// Most keys have one value: its slice has no room, so an
			// append to it cannot write into the next key's.
			vv, vals = vals[:1:1], vals[1:]
			vv[0] = value
			h[key] = vv
		}
	}
	if rest != "" || f.host == "" || !httpguts.ValidHostHeader(f.host) {
		return f, false
	}
	if f.pragmaNoCache && h["Cache-Control"] == nil {
		h["Cache-Control"] = []string{"no-cache"} // as ReadRequest (fixPragmaCacheControl)
	}
	return f, true
}

// A request's header values' slices are allocated with it for up to
// headFew header lines (curl, wrk, Go's client), or headMany (an OpenAI
// SDK sends about 18); more take an allocation of their own.
const (
	headFew  = 8
	headMany = 24
)

// newParsedHead returns a request, a URL and room for the values of n
// header lines, allocated together when n is at most headMany.
func newParsedHead(n int) (*http.Request, *url.URL, []string) {
	switch {
	case n <= headFew:
		p := new(struct {
			req  http.Request
			u    url.URL
			vals [headFew]string
		})
		return &p.req, &p.u, p.vals[:]
	case n <= headMany:
		p := new(struct {
			req  http.Request
			u    url.URL
			vals [headMany]string
		})
		return &p.req, &p.u, p.vals[:]
	}
	p := new(struct {
		req http.Request
		u   url.URL
	})
	return &p.req, &p.u, make([]string, n)
}

// parseTarget parses an origin-form request target as
// url.ParseRequestURI does, into u when its path has only bytes that need
// no escaping and its query only printable ASCII, through
// url.ParseRequestURI otherwise (escapes, other bytes); nil when it is
// not a valid origin-form target.
func parseTarget(t string, u *url.URL) *url.URL {
	if t == "" || t[0] != '/' {
		return nil
	}
	path, query, hasQuery := strings.Cut(t, "?")
	if plainPath(path) && printable(query) {
		*u = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
		return u
	}
	pu, err := url.ParseRequestURI(t)
	if err != nil || pu.Host != "" || pu.Scheme != "" || pu.Opaque != "" {
		return nil
	}
	return pu
}

// headFields is what parseHead notes of the header fields it reads.
type headFields struct {
	host          string
	hasHost       bool
	cl            int64
	hasCL         bool
	pragma        bool // a Pragma field was seen
	pragmaNoCache bool // the first one says no-cache
}

// note notes the field key: value (key canonical) and reports whether
// parseHead can go on: false for the fields whose requests go back to
// net/http.
func (f *headFields) note(key, value string) bool {
	switch key {
	case "Host":
		if f.hasHost {
			return false
		}
		f.host, f.hasHost = value, true
	case "Content-Length":
		if f.hasCL {
			return false
		}
		n, ok := h1.ContentLength(value)
		f.cl, f.hasCL = n, true
		return ok
	case "Connection":
		// (The length keeps EqualFold to ASCII: no Kelvin sign for a k.)
		return len(value) == len("keep-alive") && strings.EqualFold(value, "keep-alive")
	case "Transfer-Encoding", "Expect", "Upgrade":
		return false
	case "Pragma":
		if !f.pragma {
			f.pragma, f.pragmaNoCache = true, value == "no-cache"
		}
	}
	return true
}

// requestLine splits an HTTP/1.1 request line into a method (a token,
// not CONNECT) and a target; bytes are checked by the caller's parse of
// the target.
func requestLine(line string) (method, target string, ok bool) {
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !h1.IsToken(method) || method == http.MethodConnect {
		return "", "", false
	}
	return method, target, true
}

// Byte classes: pathByte for the path bytes net/url leaves unescaped,
// printByte for printable ASCII. (Methods and header fields are checked
// with h1's.)
var pathByte, printByte = byteClasses()

func byteClasses() (path, print [256]bool) {
	for c := range 256 {
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		path[c] = alnum || strings.IndexByte("$&+,-./:;=@_~", byte(c)) >= 0
		print[c] = c > ' ' && c < 0x7f
	}
	return
}

func plainPath(s string) bool {
	for i := 0; i < len(s); i++ {
		if !pathByte[s[i]] {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if !printByte[s[i]] {
			return false
		}
	}
	return true
}
