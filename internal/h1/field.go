package h1

import "strings"

// MaxLengthDigits bounds the Content-Length ContentLength parses: 18
// digits never overflow an int64. A longer value is refused, and the
// parser that refuses it hands the head to net/http.
const MaxLengthDigits = 18

// ContentLength parses a Content-Length value: 1 to MaxLengthDigits
// decimal digits, leading zeros allowed, nothing else (no sign, no
// blank, no list).
func ContentLength(v string) (int64, bool) {
	if v == "" || len(v) > MaxLengthDigits {
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

// NextLine splits s after its first line, which must end in CRLF: the
// line is what comes before the first CR, and that CR must be followed by
// LF. A bare CR, or a line with no CRLF, is refused; a bare LF is kept in
// the line, for the caller's checks of the line to refuse (HeaderField,
// IsToken and ValidValue refuse it).
func NextLine(s string) (line, rest string, ok bool) {
	i := strings.IndexByte(s, '\r')
	if i < 0 || i+1 >= len(s) || s[i+1] != '\n' {
		return "", "", false
	}
	return s[:i], s[i+2:], true
}

// HeaderField splits a header line (without its CRLF) into its canonical
// key (CanonicalKey) and its value with the spaces and tabs around it
// trimmed. The line must be a name that is a token, a colon right after
// it, and a value whose every byte ValidValue accepts: obs-fold (a line starting
// with a blank), a blank before the colon, a name byte that is not a
// token's, and a value holding a control byte other than HTAB (CR, LF,
// NUL, DEL) are refused.
func HeaderField(line string) (key, value string, ok bool) {
	i := strings.IndexByte(line, ':')
	if i <= 0 {
		return "", "", false
	}
	key, ok = CanonicalKey(line[:i])
	if !ok {
		return "", "", false
	}
	v := line[i+1:]
	if !ValidValue(v) {
		return "", "", false
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

// CanonicalKey returns the canonical form of the header name k (as
// http.CanonicalHeaderKey), false when k is not a token (IsToken). A
// canonical k is returned as it is, a common one (commonKeys) as its
// constant; only another non-canonical one is allocated.
func CanonicalKey(k string) (string, bool) {
	if k == "" {
		return "", false
	}
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
// requests to the proxy (HTTP/2-minded SDKs send them in lower case) and
// in inference servers' answers (uvicorn sends them in lower case) to
// constants, so that a name sent in lower case costs no allocation.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		// Requests.
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Encoding", "Content-Length", "Content-Type", "Cookie", "Host",
		"Openai-Organization", "Openai-Project", "Origin", "Pragma", "Referer", "Traceparent",
		"Sec-Fetch-Mode", "Tracestate", "User-Agent", "X-Api-Key", "X-Forwarded-For", "X-Forwarded-Proto",
		"X-Real-Ip", "X-Request-Id", "X-Stainless-Arch", "X-Stainless-Async", "X-Stainless-Lang",
		"X-Stainless-Os", "X-Stainless-Package-Version", "X-Stainless-Read-Timeout", "X-Stainless-Retry-Count",
		"X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
		// Responses.
		"Accept-Ranges", "Access-Control-Allow-Credentials", "Access-Control-Allow-Headers",
		"Access-Control-Allow-Methods", "Access-Control-Allow-Origin", "Access-Control-Expose-Headers",
		"Age", "Alt-Svc", "Cache-Control", "Connection", "Content-Encoding", "Content-Length",
		"Content-Type", "Date", "Etag", "Expires", "Keep-Alive", "Last-Modified", "Location",
		"Openai-Model", "Openai-Organization", "Openai-Processing-Ms", "Openai-Version", "Pragma",
		"Retry-After", "Server", "Set-Cookie", "Strict-Transport-Security", "Traceparent",
		"Transfer-Encoding", "Vary", "Www-Authenticate", "X-Accel-Buffering", "X-Content-Type-Options",
		"X-Frame-Options", "X-Process-Time", "X-Request-Id",
	} {
		m[k] = k
	}
	return m
}()

// Byte classes: tokenByte for methods and header names (RFC 9110 tchar,
// as httpguts), valueByte for header values (VCHAR, SP, HTAB, obs-text,
// as net/http).
var tokenByte, valueByte = byteClasses()

func byteClasses() (token, value [256]bool) {
	for c := range 256 {
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		token[c] = alnum || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
		value[c] = c == '\t' || c >= ' ' && c != 0x7f
	}
	return
}

// IsToken reports whether s is a token (RFC 9110): one or more of the
// letters, digits and !#$%&'*+-.^_`|~, as a method or a header name must
// be.
func IsToken(s string) bool {
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

// ValidValue reports whether every byte of s may be in a header value as
// net/http accepts one (httpguts.ValidHeaderFieldValue): visible ASCII,
// space, tab and bytes from 0x80 up (obs-text); no other control byte.
// The empty s is valid.
func ValidValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if !valueByte[s[i]] {
			return false
		}
	}
	return true
}
