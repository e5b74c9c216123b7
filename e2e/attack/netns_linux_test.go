//go:build linux

package attack

import (
	"errors"
	"net"
	"os"
	"runtime"
	"syscall"
)

// listenInNetns opens a TCP listener on addr inside the named network
// namespace (/run/netns/ns): a thread of its own joins the namespace,
// opens the socket there and ends with its goroutine (a locked thread
// that exits is discarded, never reused in the wrong namespace). The
// socket stays in the namespace; accepting from it and dialling out from
// any other thread (the host's namespace) works as usual.
func listenInNetns(ns, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		trap, ok := setnsTrap[runtime.GOARCH]
		if !ok {
			ch <- result{err: errors.New("setns: no syscall number for " + runtime.GOARCH)}
			return
		}
		if _, _, errno := syscall.RawSyscall(trap, f.Fd(), syscall.CLONE_NEWNET, 0); errno != 0 {
			ch <- result{err: os.NewSyscallError("setns", errno)}
			return
		}
		ln, err := net.Listen("tcp", addr)
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

// setnsTrap is setns(2)'s number (the syscall package names it on some
// architectures only).
var setnsTrap = map[string]uintptr{"amd64": 308, "arm64": 268, "386": 346, "arm": 375, "riscv64": 268,
	"ppc64le": 350, "s390x": 339, "loong64": 268}
