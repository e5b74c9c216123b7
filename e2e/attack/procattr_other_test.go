//go:build !linux

package attack

import "syscall"

// childAttr: without Linux's parent-death signal, children are only
// stopped by the test's cleanup.
func childAttr() *syscall.SysProcAttr { return nil }
