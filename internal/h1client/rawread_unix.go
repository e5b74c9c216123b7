//go:build unix

package h1client

import (
	"net"
	"syscall"
)

// rawReader reads a connection through its file descriptor so that a
// buffer is taken from bufPool only once data is there: while the
// connection has nothing to read (a parked stream), the goroutine waits in
// the poller and holds no buffer.
type rawReader struct {
	rc   syscall.RawConn
	bufs *Buffers
	// read is readPooled's, made once per connection, with its results
	// (one read at a time per connection).
	read func(fd uintptr) bool
	bp   *[]byte
	n    int
	rerr error
}

func newRawReader(c net.Conn, bufs *Buffers) *rawReader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawReader{rc: rc, bufs: bufs}
	r.read = func(fd uintptr) bool {
		r.bp = r.bufs.Get()
		for {
			r.n, r.rerr = syscall.Read(int(fd), *r.bp)
			if r.rerr != syscall.EINTR {
				break
			}
		}
		if r.rerr == syscall.EAGAIN || r.rerr == syscall.EWOULDBLOCK {
			r.bufs.Put(r.bp)
			r.bp = nil
			return false // wait for readability, holding nothing
		}
		return true
	}
	return r
}

// readPooled waits until the connection is readable, then reads into a
// pooled buffer; n is 0 at end of stream. The caller owns bp (when not
// nil) and puts it back. A deadline or a closed connection ends the wait
// with the error net.Conn.Read would return.
func (r *rawReader) readPooled() (bp *[]byte, n int, err error) {
	r.bp, r.n, r.rerr = nil, 0, nil
	err = r.rc.Read(r.read)
	bp, n = r.bp, r.n
	if err == nil {
		err = r.rerr
	}
	r.bp, r.rerr = nil, nil
	if err != nil || n <= 0 {
		if bp != nil {
			r.bufs.Put(bp)
			bp = nil
		}
		if n < 0 {
			n = 0
		}
	}
	return bp, n, err
}

// relay reads the connection until feed returns false: each time it is
// readable, one read into a pooled buffer, given to feed (empty at the end
// of the stream). It runs inside one RawConn.Read, whose readiness is not
// reset between reads: after a short read it waits for the next bytes
// without first reading nothing, and holds no buffer while it waits.
func (r *rawReader) relay(feed func([]byte) bool) error {
	var ferr error
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			bp := r.bufs.Get()
			n, err := syscall.Read(int(fd), *bp)
			for err == syscall.EINTR {
				n, err = syscall.Read(int(fd), *bp)
			}
			if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK {
				r.bufs.Put(bp)
				return false // drained: wait
			}
			if err != nil {
				r.bufs.Put(bp)
				ferr = err
				return true
			}
			more := feed((*bp)[:n])
			full := n == len(*bp)
			r.bufs.Put(bp)
			switch {
			case !more:
				return true
			case !full:
				return false // drained: wait for the next bytes
			}
		}
	})
	if err == nil {
		err = ferr
	}
	return err
}
