// Package rlimit raises the process's open-files limit (RLIMIT_NOFILE)
// to its hard limit and reports it. A proxy holding thousands of streams
// needs a descriptor for each caller and each instance connection; a
// soft limit of 1024 would run out long before anything else.
//
// Go itself raises the soft limit when a program starts (since Go 1.19),
// where it can; Raise makes that explicit, covers a limit lowered since,
// and says what the limits are. It is implemented on Linux; elsewhere it
// returns errors.ErrUnsupported and changes nothing.
package rlimit

// Limit is an open-files limit: the soft one the kernel enforces and the
// hard one an unprivileged process may raise it to.
type Limit struct {
	Soft, Hard uint64
}
