package tcplisten

import (
	"context"
	"net"
	"time"
)

// DeferFor is how long the kernel holds a connection that has sent
// nothing before handing it to the server anyway.
const DeferFor = time.Second

// Listen opens a TCP listener on addr (host:port), with deferred accept
// where the system has it.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: control}
	return lc.Listen(ctx, "tcp", addr)
}
