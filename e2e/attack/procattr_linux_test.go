//go:build linux

package attack

import "syscall"

// childAttr makes a child process die with the harness, even when the
// harness itself is killed (a go test timeout): no replica or simulator
// outlives the run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
