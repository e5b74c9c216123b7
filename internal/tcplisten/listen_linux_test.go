//go:build linux

package tcplisten

import (
	"context"
	"net"
	"syscall"
	"testing"
)

// TestListenDefersAccept: the listener carries TCP_DEFER_ACCEPT.
func TestListenDefersAccept(t *testing.T) {
	ln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if v <= 0 {
		t.Fatalf("TCP_DEFER_ACCEPT is %d, want deferred accept", v)
	}
}
