package h1client

import (
	"bufio"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// readResponse reads a response head from br, as the answer to req, and
// returns what http.ReadResponse(br, req) returns: the same fields, a
// body read the same way (body bytes, errors and what is left in br), the
// same error. The common heads are parsed here (parseResponse); any other
// goes to http.ReadResponse, br untouched. FuzzReadResponse proves it
// against http.ReadResponse.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if resp := parseResponse(br, req); resp != nil {
		return resp, nil
	}
	return http.ReadResponse(br, req)
}

// parseResponse parses the response head at the start of br when
// http.ReadResponse would accept it and it is one of the shapes parsed
// here: all of it in br's buffer (read into it if need be), HTTP/1.1, a
// status line of the version, a space, three digits and an optional
// reason, every line ended by CRLF, header names that are tokens and
// values of the bytes net/http accepts (h1.HeaderField), at most one
// Content-Length (of at most h1.MaxLengthDigits digits) and at most one
// Transfer-Encoding (chunked), not both, and no Trailer field. It
// returns nil, having consumed nothing, for any other head (or when
// reading it fails).
//
// The head is copied into one string, which its fields are sliced from;
// the response, its body and the header values' slices are one
// allocation (newParsedResponse); the header map is made for its keys;
// a header name sent in lower case costs no allocation when it is a
// common one (h1.CanonicalKey).
func parseResponse(br *bufio.Reader, req *http.Request) *http.Response {
	head := peekHead(br)
	if head == nil {
		return nil
	}
	s := string(head)
	line, rest, ok := h1.NextLine(s)
	if !ok {
		return nil
	}
	status, code, ok := statusLine(line)
	if !ok {
		return nil
	}
	lines := strings.Count(rest, "\r\n") - 1 // header lines, the blank one aside
	resp, b, te, vals := newParsedResponse(lines)
	h := make(http.Header, lines)
	f, ok := readFields(rest, h, vals)
	if !ok {
		return nil
	}
	method := http.MethodGet // as ReadResponse for a nil request
	if req != nil {
		method = req.Method
	}
	*resp = http.Response{Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Request: req}
	frame(resp, f, method, b, br)
	if f.chunked {
		te[0] = "chunked"
		resp.TransferEncoding = te[:]
	}
	if _, err := br.Discard(len(head)); err != nil {
		return nil // cannot happen: the head is buffered
	}
	return resp
}

// frame sets resp's ContentLength, Close and Body from the fields f
// noted, for a request of method, as ReadResponse does (readTransfer,
// fixLength, shouldClose); b is the body to use when there is one, read
// from br.
func frame(resp *http.Response, f respFields, method string, b *respBody, br *bufio.Reader) {
	code := resp.StatusCode
	bodyAllowed := code/100 != 1 && code != http.StatusNoContent && code != http.StatusNotModified
	length := int64(-1) // the body's length, -1 when chunked or to the close
	switch {
	case method == http.MethodHead || !bodyAllowed:
		length = 0
	case f.chunked:
	case f.hasCL:
		length = f.cl
	}
	resp.ContentLength = length
	if method == http.MethodHead {
		resp.ContentLength = -1
		if f.hasCL {
			resp.ContentLength = f.cl
		}
	}
	if f.close {
		delete(resp.Header, "Connection") // as ReadResponse (shouldClose)
	}
	resp.Close = f.close || length < 0 && !f.chunked && bodyAllowed
	resp.Body = http.NoBody
	b.r, b.closing = br, resp.Close
	switch {
	case f.chunked:
		if method != http.MethodHead && bodyAllowed {
			b.kind, b.trailer = bodyChunked, resp
			resp.Body = b
		}
	case length > 0:
		b.kind, b.left = bodyLength, length
		resp.Body = b
	case length < 0 && resp.Close:
		b.kind = bodyToClose
		resp.Body = b
	}
}

// peekHead returns the response head at the start of br, through its
// blank line, without consuming it: nil when br's buffer cannot hold it,
// when reading more of it fails (http.ReadResponse then meets the same
// error: a connection's errors, as a reader's EOF, repeat), or when the
// head ends at a blank line net/http accepts but this parser does not (a
// bare LF: "\n\n" or "\n\r\n" not preceded by CR), which net/http then
// reads as it would have, without waiting for more bytes.
func peekHead(br *bufio.Reader) []byte {
	from := 0
	for {
		n := br.Buffered()
		b, _ := br.Peek(n)
		if end, ok := headEnd(b, from); end > 0 {
			if !ok {
				return nil
			}
			return b[:end]
		}
		if n >= br.Size() {
			return nil
		}
		if _, err := br.Peek(n + 1); err != nil {
			return nil
		}
		from = max(n-len(crlfcrlf)+1, 0)
	}
}

// headEnd finds the first blank line in b at or after from (where a line
// feed may start one): it returns the length of the head through it and
// whether it ends in CRLF CRLF; 0 when b holds no blank line yet.
func headEnd(b []byte, from int) (end int, crlf bool) {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 2, false
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i + 3, i > 0 && b[i-1] == '\r'
		}
	}
	return 0, false
}

var crlfcrlf = []byte("\r\n\r\n")

// statusLine parses an HTTP/1.1 status line: the version, one space,
// three digits, and nothing else or a space and a reason of bytes a
// header value may hold. status is what follows the version's space.
func statusLine(line string) (status string, code int, ok bool) {
	const prefix = "HTTP/1.1 "
	if len(line) < len(prefix)+3 || line[:len(prefix)] != prefix {
		return "", 0, false
	}
	status = line[len(prefix):]
	for i := range 3 {
		c := status[i]
		if c < '0' || c > '9' {
			return "", 0, false
		}
		code = code*10 + int(c-'0')
	}
	if len(status) > 3 && status[3] != ' ' || !h1.ValidValue(status[3:]) {
		return "", 0, false
	}
	return status, code, true
}

// respFields is what parseResponse notes of the header fields it reads.
type respFields struct {
	cl            int64
	hasCL         bool
	chunked       bool
	close         bool // Connection holds the token close
	pragmaNoCache bool // the first Pragma says no-cache
}

// readFields reads the header lines in rest, through the blank line that
// ends it, into h, slicing each key's values from vals (room for one value
// per line), and returns what it noted of them; false when the head goes
// to http.ReadResponse. It leaves out Transfer-Encoding, and fixes
// Cache-Control after Pragma, as ReadResponse does.
func readFields(rest string, h http.Header, vals []string) (f respFields, ok bool) {
	pragma := false
	for {
		var line string
		if line, rest, ok = h1.NextLine(rest); !ok {
			return f, false
		}
		if line == "" {
			break
		}
		key, value, ok := h1.HeaderField(line)
		if !ok {
			return f, false
		}
		switch key {
		case "Content-Length":
			if f.hasCL || f.chunked {
				return f, false
			}
			if f.cl, ok = h1.ContentLength(value); !ok {
				return f, false
			}
			f.hasCL = true
		case "Transfer-Encoding":
			if f.chunked || f.hasCL || len(value) != len("chunked") || !strings.EqualFold(value, "chunked") {
				return f, false
			}
			f.chunked = true
			continue // ReadResponse takes it out of the header
		case "Trailer":
			return f, false
		case "Pragma":
			if !pragma {
				pragma, f.pragmaNoCache = true, value == "no-cache"
			}
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
	if rest != "" {
		return f, false
	}
	f.close = httpguts.HeaderValuesContainsToken(h["Connection"], "close")
	if f.pragmaNoCache && h["Cache-Control"] == nil {
		h["Cache-Control"] = []string{"no-cache"} // as ReadResponse (fixPragmaCacheControl)
	}
	return f, true
}

// A response's header values' slices are allocated with it for up to
// headFew header lines (an inference server's answer has 4 to 8), or
// headMany; more take an allocation of their own.
const (
	headFew  = 8
	headMany = 24
)

// newParsedResponse returns a response, its body, its Transfer-Encoding
// and room for the values of n header lines, allocated together when n
// is at most headMany.
func newParsedResponse(n int) (*http.Response, *respBody, *[1]string, []string) {
	switch {
	case n <= headFew:
		p := new(struct {
			resp http.Response
			body respBody
			te   [1]string
			vals [headFew]string
		})
		return &p.resp, &p.body, &p.te, p.vals[:]
	case n <= headMany:
		p := new(struct {
			resp http.Response
			body respBody
			te   [1]string
			vals [headMany]string
		})
		return &p.resp, &p.body, &p.te, p.vals[:]
	}
	p := new(struct {
		resp http.Response
		body respBody
		te   [1]string
	})
	return &p.resp, &p.body, &p.te, make([]string, n)
}
