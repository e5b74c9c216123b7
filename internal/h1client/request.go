package h1client

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// Request is one request for Client.RoundTrip.
type Request struct {
	Addr   string      // the host:port dialed
	Host   string      // the Host header
	Method string      // a valid method token (the caller checks it)
	Path   string      // escaped; spaces, tabs, CR and LF are escaped again here
	Query  string      // escaped, without '?'
	Header http.Header // written as is, CR and LF in values replaced; no Host or Content-Length
	Body   []byte      // sent with a Content-Length (0 for POST, PUT and PATCH without a body)
	// Spare asks for a connection to Addr dialed ahead when this request
	// leaves none idle (see Client.keepSpare): the next request, the next
	// stream of a burst say, then finds its connection open.
	Spare bool
}

// writeRequest writes the request head and body to w: one buffered write,
// so headers and a small body leave in one packet.
func writeRequest(w *bufio.Writer, x *Request) {
	body := x.Body
	w.WriteString(x.Method)
	w.WriteByte(' ')
	writeSafe(w, x.Path)
	if x.Query != "" {
		w.WriteByte('?')
		writeSafe(w, x.Query)
	}
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(x.Host)
	w.WriteString("\r\n")
	for k, vv := range x.Header {
		for _, v := range vv {
			if v == "" && k == "User-Agent" {
				continue
			}
			h1.WriteField(w, k, v)
		}
	}
	if len(body) > 0 || x.Method == http.MethodPost || x.Method == http.MethodPut || x.Method == http.MethodPatch {
		w.WriteString("Content-Length: ")
		w.Write(strconv.AppendInt(w.AvailableBuffer(), int64(len(body)), 10)) // in the buffer: no copy, no allocation
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
	w.Write(body)
}

// writeSafe writes a request-target, escaping the bytes that would end or
// split the request line.
func writeSafe(w *bufio.Writer, s string) {
	if !strings.ContainsAny(s, " \r\n\t") {
		w.WriteString(s)
		return
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\r', '\n', '\t':
			w.WriteByte('%')
			w.WriteByte("0123456789ABCDEF"[c>>4])
			w.WriteByte("0123456789ABCDEF"[c&15])
		default:
			w.WriteByte(c)
		}
	}
}
