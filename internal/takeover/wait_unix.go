//go:build unix

package takeover

import "syscall"

// waitReadable waits, holding no buffer, until the socket has bytes, an
// end or an error to read (or its read deadline passes).
func waitReadable(rc syscall.RawConn) error {
	var b [1]byte
	return rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
	})
}
