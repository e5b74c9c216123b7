package h1client

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// TestWriteRequestCannotSplit: whatever the caller passes in the path,
// query or a header value, net/http reads back exactly one request with
// the fields given, a Content-Length where a body is sent, and nothing
// after it.
func TestWriteRequestCannotSplit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		x    Request
		path string // the request-target net/http reads back
	}{
		{"plain", Request{Method: "GET", Path: "/v1/models", Host: "h:80"}, "/v1/models"},
		{"query", Request{Method: "GET", Path: "/a", Query: "x=1&y=2", Host: "h"}, "/a?x=1&y=2"},
		{"line breaks in the path", Request{Method: "GET", Path: "/a b\r\nX-Evil: 1\r\n\r\nGET /c", Host: "h"},
			"/a%20b%0D%0AX-Evil:%201%0D%0A%0D%0AGET%20/c"},
		{"tab in the query", Request{Method: "GET", Path: "/a", Query: "q=\t", Host: "h"}, "/a?q=%09"},
		{"post without a body", Request{Method: "POST", Path: "/p", Host: "h"}, "/p"},
		{"post with a body", Request{Method: "POST", Path: "/p", Host: "h", Body: []byte(`{"a":1}`),
			Header: http.Header{"X-Note": {"one\r\nX-Evil: 2"}}}, "/p"},
	} {
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		writeRequest(w, &c.x)
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(bytes.NewReader(buf.Bytes()))
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Fatalf("%s: %v\n%q", c.name, err, buf.String())
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			t.Fatalf("%s: body: %v", c.name, err)
		}
		switch {
		case req.Method != c.x.Method || req.RequestURI != c.path || req.Host != c.x.Host:
			t.Errorf("%s: %s %s (Host %s); want %s %s (Host %s)", c.name, req.Method, req.RequestURI, req.Host,
				c.x.Method, c.path, c.x.Host)
		case !bytes.Equal(body, c.x.Body):
			t.Errorf("%s: body %q, want %q", c.name, body, c.x.Body)
		case req.Header.Get("X-Evil") != "":
			t.Errorf("%s: a value started a field: %q", c.name, req.Header)
		case c.x.Method == "POST" && req.ContentLength != int64(len(c.x.Body)):
			t.Errorf("%s: Content-Length %d, want %d", c.name, req.ContentLength, len(c.x.Body))
		case br.Buffered() > 0:
			t.Errorf("%s: %d bytes after the request", c.name, br.Buffered())
		}
	}
}

// TestBuffersHeld: Held counts every buffer taken and not given back,
// per Buffers value.
func TestBuffersHeld(t *testing.T) {
	t.Parallel()
	var a, b Buffers
	p := a.Get()
	r := a.reader()
	w := b.writer()
	if a.Held() != 2 || b.Held() != 1 {
		t.Fatalf("held %d and %d, want 2 and 1", a.Held(), b.Held())
	}
	if len(*p) != CopySize {
		t.Fatalf("copy buffer of %d bytes, want %d", len(*p), CopySize)
	}
	a.Put(p)
	a.putReader(r)
	b.putWriter(w)
	if a.Held() != 0 || b.Held() != 0 {
		t.Fatalf("held %d and %d after giving back, want 0", a.Held(), b.Held())
	}
}
