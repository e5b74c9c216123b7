package takeover

import (
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
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
	line, rest, ok := nextLine(s)
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
		if line, rest, ok = nextLine(rest); !ok {
			return f, false
		}
		if line == "" {
			break
		}
		key, value, ok := headerField(line)
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
		n, ok := contentLength(value)
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

// maxLengthDigits bounds the Content-Length parsed here: 18 digits never
// overflow an int64 (a longer one goes back to net/http).
const maxLengthDigits = 18

// contentLength parses a Content-Length value: decimal digits only.
func contentLength(v string) (int64, bool) {
	if v == "" || len(v) > maxLengthDigits {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// nextLine splits s after its first line, which must end in CRLF.
func nextLine(s string) (line, rest string, ok bool) {
	i := strings.IndexByte(s, '\r')
	if i < 0 || i+1 >= len(s) || s[i+1] != '\n' {
		return "", "", false
	}
	return s[:i], s[i+2:], true
}

// requestLine splits an HTTP/1.1 request line into a method (a token,
// not CONNECT) and a target; bytes are checked by the caller's parse of
// the target.
func requestLine(line string) (method, target string, ok bool) {
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !isToken(method) || method == http.MethodConnect {
		return "", "", false
	}
	return method, target, true
}

// headerField splits a header line into its canonical key and its value
// without the blanks around it. A line that does not start with a token
// and a colon (obs-fold, a blank before the colon), or whose value holds
// a byte net/http refuses, is refused.
func headerField(line string) (key, value string, ok bool) {
	i := strings.IndexByte(line, ':')
	if i <= 0 {
		return "", "", false
	}
	key, ok = canonicalKey(line[:i])
	if !ok {
		return "", "", false
	}
	v := line[i+1:]
	for j := 0; j < len(v); j++ {
		if !valueByte[v[j]] {
			return "", "", false
		}
	}
	return key, trimBlanks(v), true
}

// trimBlanks trims spaces and tabs at both ends of s.
func trimBlanks(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// maxCanonKey is the longest non-canonical key canonicalized without an
// allocation when it is a common one.
const maxCanonKey = 64

// canonicalKey returns the canonical form of the header name k (as
// http.CanonicalHeaderKey), false when k is not a token. A canonical k is
// returned as it is, a common one as its constant; only another
// non-canonical one is allocated.
func canonicalKey(k string) (string, bool) {
	canon, upper := true, true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !tokenByte[c] {
			return "", false
		}
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			canon = false
		}
		upper = c == '-'
	}
	if canon {
		return k, true
	}
	var buf [maxCanonKey]byte
	b := buf[:0]
	if len(k) > len(buf) {
		b = make([]byte, 0, len(k))
	}
	upper = true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
		upper = c == '-'
	}
	if v, ok := commonKeys[string(b)]; ok {
		return v, true
	}
	return string(b), true
}

// commonKeys maps the canonical names of the header fields common in
// requests to the proxy to constants, so that a client sending them in
// lower case (as HTTP/2-minded SDKs do) costs no allocation for them.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Encoding", "Content-Length", "Content-Type", "Cookie", "Host",
		"Openai-Organization", "Openai-Project", "Origin", "Pragma", "Referer", "Traceparent",
		"Sec-Fetch-Mode", "Tracestate", "User-Agent", "X-Api-Key", "X-Forwarded-For", "X-Forwarded-Proto",
		"X-Real-Ip", "X-Request-Id", "X-Stainless-Arch", "X-Stainless-Async", "X-Stainless-Lang",
		"X-Stainless-Os", "X-Stainless-Package-Version", "X-Stainless-Read-Timeout", "X-Stainless-Retry-Count",
		"X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
	} {
		m[k] = k
	}
	return m
}()

// Byte classes: tokenByte for methods and header names (RFC 9110 tchar,
// as httpguts), valueByte for header values (VCHAR, SP, HTAB, obs-text,
// as net/http), pathByte for the path bytes net/url leaves unescaped,
// printByte for printable ASCII.
var tokenByte, valueByte, pathByte, printByte = byteClasses()

func byteClasses() (token, value, path, print [256]bool) {
	for c := range 256 {
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		token[c] = alnum || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
		value[c] = c == '\t' || c >= ' ' && c != 0x7f
		path[c] = alnum || strings.IndexByte("$&+,-./:;=@_~", byte(c)) >= 0
		print[c] = c > ' ' && c < 0x7f
	}
	return
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte[s[i]] {
			return false
		}
	}
	return true
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
