package takeover

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy/internal/h1"
)

// response is the http.ResponseWriter of a request on a taken-over
// connection. As net/http's, it sends the head with the first body bytes
// (or at Flush or the end), sniffs a missing Content-Type, frames the
// body with the declared Content-Length or chunked encoding, and refuses
// writes past the declared length.
type response struct {
	c         *conn
	req       *http.Request
	h         http.Header
	wrote     bool // status chosen
	committed bool // head written
	status    int
	chunked   bool
	noBody    bool
	cl        int64 // declared Content-Length, -1 if none
	n         int64 // body bytes written
	err       error
	close     bool
}

func (w *response) Header() http.Header { return w.h }

func (w *response) WriteHeader(code int) {
	if w.wrote || w.err != nil {
		return
	}
	if code < 200 { // informational: sent at once
		w.writeHead(code)
		return
	}
	w.wrote, w.status = true, code
}

// commit writes the head, first sniffing the type from the first bytes.
func (w *response) commit(first []byte) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.committed = true
	code := w.status
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	if v := w.h["Content-Length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n >= 0 {
			w.cl = n
		} else {
			delete(w.h, "Content-Length")
		}
	}
	delete(w.h, "Transfer-Encoding")
	if w.cl < 0 && !w.noBody {
		w.chunked = true
		w.h["Transfer-Encoding"] = chunkedTE
	}
	if len(first) > 0 && !w.noBody && w.h["Content-Type"] == nil {
		w.h["Content-Type"] = []string{http.DetectContentType(first)}
	}
	for _, v := range w.h["Connection"] {
		if strings.EqualFold(strings.TrimSpace(v), "close") {
			w.close = true
		}
	}
	if w.c.t.closing.Load() {
		// Shutting down: as net/http, the connection closes after this.
		w.close = true
		w.h["Connection"] = connectionClose
	}
	if w.h["Date"] == nil {
		w.h["Date"] = []string{w.c.t.bufs.httpDate()}
	}
	w.writeHead(code)
}

var (
	chunkedTE       = []string{"chunked"}
	connectionClose = []string{"close"}
)

func (w *response) writeHead(code int) {
	bw := w.c.writer()
	var nb [3]byte
	_, _ = bw.WriteString("HTTP/1.1 ")
	_, _ = bw.Write(strconv.AppendInt(nb[:0], int64(code), 10))
	_ = bw.WriteByte(' ')
	_, _ = bw.WriteString(http.StatusText(code))
	_, _ = bw.WriteString("\r\n")
	for k, vv := range w.h {
		for _, v := range vv {
			h1.WriteField(bw, k, v)
		}
	}
	_, err := bw.WriteString("\r\n")
	w.fail(err)
}

func (w *response) fail(err error) {
	if err != nil && w.err == nil {
		w.err = err
		w.c.mu.Lock()
		if w.c.cancel != nil {
			w.c.cancel() // the client is gone: stop the request
		}
		w.c.mu.Unlock()
	}
}

func (w *response) Write(p []byte) (int, error) {
	if !w.committed {
		w.commit(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody {
		if w.status == http.StatusNoContent || w.status == http.StatusNotModified {
			return 0, http.ErrBodyNotAllowed
		}
		return len(p), nil
	}
	if w.cl >= 0 && w.n+int64(len(p)) > w.cl {
		return 0, http.ErrContentLength
	}
	if len(p) == 0 {
		return 0, nil
	}
	bw := w.c.writer()
	if w.chunked {
		// Formatted in the buffer's free space: no copy, no allocation.
		_, _ = bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
	}
	n, err := bw.Write(p)
	if w.chunked && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	w.n += int64(n)
	w.fail(err)
	return n, err
}

// Flush sends what is buffered (http.Flusher).
func (w *response) Flush() {
	if !w.committed {
		w.commit(nil)
	}
	if w.err == nil {
		w.fail(w.c.writer().Flush())
		w.c.releaseWriter() // a stream holds none between its pieces
	}
}

// finish completes the response and reports whether the connection can
// be reused.
func (w *response) finish() bool {
	if !w.committed {
		if w.h["Content-Length"] == nil && w.req.Method != http.MethodHead && (!w.wrote || h1.BodyAllowed(w.status)) {
			w.h["Content-Length"] = zeroLength // an empty body, unless none is allowed (204, 304)
		}
		w.commit(nil)
	}
	if w.chunked && w.err == nil {
		_, err := w.c.writer().WriteString("0\r\n\r\n")
		w.fail(err)
	}
	if w.err == nil {
		w.fail(w.c.writer().Flush())
		w.c.releaseWriter()
	}
	short := w.cl >= 0 && !w.noBody && w.n < w.cl
	return w.err == nil && !w.close && !short
}

var zeroLength = []string{"0"}
