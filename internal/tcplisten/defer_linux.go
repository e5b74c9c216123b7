//go:build linux

package tcplisten

import "syscall"

// control sets TCP_DEFER_ACCEPT on the listening socket before it binds.
func control(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, int(DeferFor.Seconds()))
	})
	if err != nil {
		return err
	}
	return serr
}
