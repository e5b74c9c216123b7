package h1client

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"sync"
)

// respBody is the body of a response parsed by parseResponse: the body
// net/http's ReadResponse gives the same response (its unexported body
// type over an io.LimitedReader, its chunked reader, or the connection),
// read and closed the same way, with the same errors. A chunked body
// makes its chunked reader (httputil.NewChunkedReader: net/http's own)
// at its first read: the Client reads a streamed body through its own
// decoder (body.streamed) and never reads this one.
type respBody struct {
	r       *bufio.Reader
	kind    uint8
	left    int64          // bytes left of a bodyLength body
	cr      io.Reader      // a bodyChunked body's reader, once read
	closing bool           // the connection closes after the body
	mu      sync.Mutex     // guards what follows, and Read and Close
	sawEOF  bool           // as net/http's body
	closed  bool           // as net/http's body
	trailer *http.Response // a chunked body's response, until its trailer is read
}

// Kinds of respBody.
const (
	bodyLength  uint8 = iota + 1 // Content-Length bytes
	bodyChunked                  // chunked
	bodyToClose                  // up to the close
)

var errTrailerEOF = errors.New("http: unexpected EOF reading trailer")

func (b *respBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.readLocked(p)
}

// readLocked is net/http's body.readLocked.
func (b *respBody) readLocked(p []byte) (n int, err error) {
	if b.sawEOF {
		return 0, io.EOF
	}
	n, err = b.readSrc(p)
	if err == io.EOF {
		b.sawEOF = true
		if b.trailer != nil {
			if e := b.readTrailer(); e != nil {
				err = e
				b.sawEOF = false
				b.closed = true
			}
			b.trailer = nil
		} else if b.kind == bodyLength && b.left > 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err == nil && n > 0 && b.kind == bodyLength && b.left == 0 {
		err = io.EOF
		b.sawEOF = true
	}
	return n, err
}

// readSrc reads what net/http's body reads from: an io.LimitedReader
// over r, the chunked reader, or r.
func (b *respBody) readSrc(p []byte) (int, error) {
	switch b.kind {
	case bodyLength:
		if b.left <= 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err := b.r.Read(p)
		b.left -= int64(n)
		return n, err
	case bodyChunked:
		if b.cr == nil {
			b.cr = httputil.NewChunkedReader(b.r)
		}
		return b.cr.Read(p)
	}
	return b.r.Read(p)
}

// readTrailer is net/http's body.readTrailer: it reads the trailer after
// the last chunk into the response's Trailer.
func (b *respBody) readTrailer() error {
	buf, err := b.r.Peek(2)
	if string(buf) == "\r\n" {
		_, _ = b.r.Discard(2)
		return nil
	}
	if len(buf) < 2 {
		return errTrailerEOF
	}
	if err != nil {
		return err
	}
	if !seeUpcomingDoubleCRLF(b.r) {
		return errors.New("http: suspiciously long trailer after chunked body")
	}
	hdr, err := textproto.NewReader(b.r).ReadMIMEHeader()
	if err != nil {
		if err == io.EOF {
			return errTrailerEOF
		}
		return err
	}
	if b.trailer.Trailer == nil {
		b.trailer.Trailer = http.Header(hdr)
	} else {
		for k, vv := range hdr {
			b.trailer.Trailer[k] = vv
		}
	}
	return nil
}

// seeUpcomingDoubleCRLF is net/http's: whether r's buffer holds a blank
// line ahead (bounding a trailer by the buffer's size).
func seeUpcomingDoubleCRLF(r *bufio.Reader) bool {
	for peekSize := 4; ; peekSize++ {
		buf, err := r.Peek(peekSize)
		if bytes.HasSuffix(buf, crlfcrlf) {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// Close is net/http's body.Close for a response: it reads the rest of the
// body unless it was read to its end or the connection closes after it.
func (b *respBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	var err error
	if !b.sawEOF && (b.trailer != nil || !b.closing) {
		_, err = io.Copy(io.Discard, lockedBody{b})
	}
	b.closed = true
	return err
}

// lockedBody reads a respBody whose lock is held.
type lockedBody struct{ b *respBody }

func (l lockedBody) Read(p []byte) (int, error) {
	if l.b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return l.b.readLocked(p)
}
