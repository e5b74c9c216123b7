package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/h1client"
)

// A token stream (text/event-stream, 200, from the lean client) on one of
// net/http's HTTP/1.1 connections is detached from its handler once its
// head is sent (h1client.Client.Detach): it is relayed on a goroutine of
// its own and the handler returns, so a parked stream holds none of
// net/http's per-request state. Its usage record is written when it ends,
// as before; the server's request log records the request when its head
// has gone out (status, time to first byte). A server shutting down cuts
// detached streams (as it ends MCP streams), so their usage records are
// queued before the proxy is closed.

// statusDetached is what serve returns when a detached stream carries on:
// the stream's goroutine writes the usage record.
const statusDetached = -1

// detach hands the rest of the response (its head not yet sent) to a
// goroutine of its own, if the lean client can, and reports whether it
// did. The stream's end writes u's record.
func (p *Proxy) detach(ctx context.Context, w http.ResponseWriter, r *http.Request, resp *http.Response, u *gpuproxy.Usage,
	start time.Time, tap answerTap) bool {
	rec := *u
	var f h1client.Filter
	if tap != nil {
		f = tap
	}
	if u.ServiceID != "" { // a service's token stream ends with an error event if cut
		f = cutFilter{f}
	}
	return p.lean.Detach(ctx, w, r, resp, p.opts.MaxResponseBody, f, func(end h1client.StreamEnd) {
		if end.Err != nil {
			p.log.Warn("proxy response cut", "request_id", rec.RequestID, "instance_id", rec.InstanceID,
				"bytes", end.Written, "err", end.Err)
		}
		rec.BytesOut = end.Written
		rec.Latency = time.Since(start)
		applyTap(&rec, tap)
		p.finish(&rec)
	})
}
