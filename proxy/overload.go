package proxy

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/aiserve/gpuproxy"
)

// overloadRetryAfter is the Retry-After, in seconds, of an overloaded
// answer: limits of our own free up as other requests end.
const overloadRetryAfter = 1

// ownLimits are the errors that say gpuproxy itself, not the instance,
// ran out of something, and the limit each one names.
var ownLimits = [...]struct {
	errno syscall.Errno
	limit string
}{
	{syscall.EMFILE, "open files"},               // this process's RLIMIT_NOFILE
	{syscall.ENFILE, "open files (system-wide)"}, // the kernel's file table
	{syscall.EADDRNOTAVAIL, "local ports"},       // no ephemeral port left to connect from
	{syscall.EADDRINUSE, "local ports"},          // likewise, when the source address is bound
	{syscall.ENOBUFS, "socket buffers"},          // kernel buffer space
	{syscall.ENOMEM, "memory"},                   // kernel memory for a socket
}

// ownLimit returns the limit of gpuproxy's own that err says was hit
// ("open files", "local ports", "socket buffers", "memory"), or "" when
// err is not one. Such a failure — on the dial or a write alike — happens
// before anything reaches the instance and says nothing about it.
func ownLimit(err error) string {
	if err == nil {
		return ""
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		for _, l := range ownLimits {
			if errno == l.errno {
				return l.limit
			}
		}
		return ""
	}
	// A name lookup keeps only the text of the error that failed it (a
	// resolver that could not open its socket): the errno's own text,
	// last, is all there is to go by.
	var de *net.DNSError
	if errors.As(err, &de) {
		for _, l := range ownLimits {
			if strings.HasSuffix(de.Err, l.errno.Error()) {
				return l.limit
			}
		}
	}
	return ""
}

// overloaded is the error for an exchange that failed on a limit of
// gpuproxy's own: 503 with Retry-After (writeError sets it from
// retry_after_seconds).
func overloaded(instanceID, limit string, err error) error {
	return &gpuproxy.Error{Code: CodeOverloaded, Cause: err,
		Message: "gpuproxy is overloaded (out of " + limit + ") and could not reach instance " + instanceID +
			"; the instance is not at fault; retry in " + strconv.Itoa(overloadRetryAfter) + "s",
		Details: map[string]any{"instance_id": instanceID, "limit": limit, "retry_after_seconds": overloadRetryAfter}}
}

// noteOverload reports an overloaded exchange — the metric, and a log line
// naming the limit that was hit — and returns err unchanged.
func (p *Proxy) noteOverload(x *exchange, err error) error {
	var ge *gpuproxy.Error
	if !errors.As(err, &ge) || ge.Code != CodeOverloaded {
		return err
	}
	limit, _ := ge.Details["limit"].(string)
	if p.opts.Metrics != nil {
		p.opts.Metrics.ProxyOverloaded(limit)
	}
	var rid string
	if v := x.header["X-Request-Id"]; len(v) > 0 {
		rid = v[0]
	}
	p.log.Warn("proxy overloaded: a limit of gpuproxy's own was hit; answered 503, the instance's breaker not charged",
		"limit", limit, "request_id", rid, "instance_id", x.instanceID, "err", ge.Cause)
	return err
}
