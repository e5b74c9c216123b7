package h1client

import (
	"bufio"
	"errors"
	"net/http"
	"testing"
)

// oneRead hands over its bytes on the first Read and counts the reads
// asked for after that (an upstream that sent its whole answer and waits).
type oneRead struct {
	b     []byte
	after int
}

var errNothingMore = errors.New("nothing more is coming")

func (r *oneRead) Read(p []byte) (int, error) {
	if r.b == nil {
		r.after++
		return 0, errNothingMore
	}
	n := copy(p, r.b)
	r.b = nil
	return n, nil
}

// TestBareLFHeadIsNotWaitedOn: a head that ends in a bare-LF blank line
// (which net/http accepts) is handed to net/http as soon as it is in, not
// held while readResponse reads on for a CRLF CRLF that never comes: on a
// connection that waits, that read lasted until the header deadline.
func TestBareLFHeadIsNotWaitedOn(t *testing.T) {
	for _, head := range []string{"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", "HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok"} {
		r := &oneRead{b: []byte(head)}
		resp, err := readResponse(bufio.NewReader(r), &http.Request{Method: http.MethodGet})
		if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != 2 {
			t.Fatalf("%q: %v, %v", head, resp, err)
		}
		if r.after != 0 {
			t.Errorf("%q: read on %d time(s) after the whole head was in", head, r.after)
		}
	}
}
