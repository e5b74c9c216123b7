//go:build !unix

package takeover

import "syscall"

// waitReadable cannot wait without reading here: the read buffer waits.
func waitReadable(syscall.RawConn) error { return nil }
