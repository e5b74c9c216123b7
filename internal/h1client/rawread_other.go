//go:build !unix

package h1client

import "net"

// rawReader is unix-only; elsewhere stream bodies are read from the
// connection with a buffer held during the read.
type rawReader struct{}

func newRawReader(net.Conn, *Buffers) *rawReader { return nil }

func (r *rawReader) readPooled() (*[]byte, int, error) { panic("unreachable") }

func (r *rawReader) relay(func([]byte) bool) error { panic("unreachable") }
