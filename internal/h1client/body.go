package h1client

import (
	"io"
	"net/http"
)

// body is a response body; it returns its connection to the pool
// once read to the end, and closes it otherwise.
//
// A body that came whole with its head is read from the head reader. A
// streamed one (chunked, longer than what came with the head, or up to
// the close) is read through src, from the connection itself once the
// head reader's bytes are used up; ready waits for its next bytes holding
// no buffer, so a parked stream holds only this struct, its chunk
// decoder's state and its goroutine.
type body struct {
	uc    *Client
	pc    *conn
	body  io.Reader
	stop  func() bool
	reuse bool
	done  bool

	src     *streamSource // a streamed body's bytes, nil when it came whole
	chunked bool
	dec     chunkDecoder // a streamed chunked body's framing
	ended   bool         // its last chunk came
	tail    bool         // exactly the blank line after it came with it
	length  int64        // bytes left of a streamed body with a length, -1 if none
}

// streamed switches resp's body to reading from src.
func (b *body) streamed(resp *http.Response) {
	b.src = &streamSource{pc: b.pc}
	b.length = -1
	switch {
	case len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked":
		b.chunked = true
		b.body = nil
	case resp.ContentLength >= 0:
		b.length = resp.ContentLength
		b.body = nil
	default:
		b.reuse = false // read to the close
		b.body = nil
	}
}

// Ready waits until the body has bytes to read, holding no buffer while
// it waits (see streamSource.fill), so a copy loop takes a buffer only to
// move bytes that are there.
func (b *body) Ready() {
	if b.src != nil && !b.done {
		b.src.fill()
	}
}

func (b *body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.read(p)
	if err == io.EOF {
		b.release(b.clean())
	} else if err != nil {
		b.release(false)
	}
	return n, err
}

func (b *body) read(p []byte) (int, error) {
	switch {
	case b.body != nil:
		return b.body.Read(p)
	case b.chunked:
		return b.readChunked(p)
	case b.length == 0:
		return 0, io.EOF
	case b.length > 0:
		if int64(len(p)) > b.length {
			p = p[:b.length]
		}
		n, err := b.src.Read(p)
		b.length -= int64(n)
		if err == io.EOF && b.length > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err == nil && b.length == 0 {
			err = io.EOF
		}
		return n, err
	}
	return b.src.Read(p) // to the close
}

// readChunked reads a streamed chunked body: what src gives is read into
// p and decoded in place (data moves only towards p's start).
func (b *body) readChunked(p []byte) (int, error) {
	if b.ended {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := b.src.Read(p)
		w := 0
		for in := p[:n]; len(in) > 0; {
			data, used, done, derr := b.dec.next(in)
			w += copy(p[w:], data)
			in = in[used:]
			if derr != nil {
				return w, derr
			}
			if done {
				b.ended = true
				b.tail = string(in) == "\r\n"
				return w, io.EOF
			}
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if w > 0 || err != nil {
			return w, err
		}
	}
}

// clean reports, at the end of the body, whether the connection is at
// the start of the next answer (nothing past the body read or pending), so
// it can be reused. A chunked body must end with the blank line after its
// last chunk (a trailer is not parsed: the connection is closed).
func (b *body) clean() bool {
	if b.src == nil {
		return b.pc.buffered() == 0
	}
	if b.chunked && !b.tail {
		return false
	}
	return b.src.buffered() == 0
}

func (b *body) Close() error {
	if !b.done {
		b.release(false)
	}
	return nil
}

func (b *body) release(eof bool) {
	b.done = true
	if b.src != nil {
		b.src.drop()
	}
	// stop reports false once the cancel hook ran (or is running): its
	// deadline may poison the connection, so it is not reused.
	if (b.stop == nil || b.stop()) && eof && b.reuse {
		b.uc.put(b.pc)
		return
	}
	b.pc.close()
}

// streamSource is where a streamed body's bytes come from: first what the
// head reader holds past the head (the head reader then goes back to its
// pool), then bytes fill read with a pooled buffer (the client's Buffers), then the connection.
type streamSource struct {
	pc   *conn
	pend *[]byte // pooled, holding pend[off:end] not yet read
	off  int
	end  int
	err  error // what fill met, returned once pend is used up
}

// fill waits, when nothing is buffered, until the connection has bytes,
// and reads them into a pooled buffer taken only once they are there
// (rawReader.readPooled). Without a file descriptor it does nothing:
// Read then waits in the connection's Read.
func (s *streamSource) fill() {
	if s.pend != nil || s.err != nil || s.pc.buffered() > 0 || s.pc.raw == nil {
		return
	}
	s.pc.releaseReader()
	bp, n, err := s.pc.raw.readPooled()
	switch {
	case err != nil:
		s.err = err
	case n == 0:
		s.err = io.EOF
	default:
		s.pend, s.off, s.end = bp, 0, n
	}
}

func (s *streamSource) Read(p []byte) (int, error) {
	if br := s.pc.br; br != nil {
		if br.Buffered() > 0 {
			return br.Read(p) // only copies: the bytes are buffered
		}
		s.pc.releaseReader()
	}
	if s.pend != nil {
		n := copy(p, (*s.pend)[s.off:s.end])
		if s.off += n; s.off == s.end {
			s.drop()
		}
		return n, nil
	}
	if s.err != nil {
		return 0, s.err
	}
	return s.pc.c.Read(p)
}

// buffered reports how many bytes were read from the connection and not
// yet from s.
func (s *streamSource) buffered() int { return s.pc.buffered() + s.end - s.off }

// drop gives back the pooled buffer (its unread bytes are dropped).
func (s *streamSource) drop() {
	if s.pend != nil {
		s.pc.bufs.Put(s.pend)
		s.pend, s.off, s.end = nil, 0, 0
	}
}
