package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/h1client"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// routePrefix is where Mount puts the reverse proxy.
const routePrefix = "/api/v1/proxy/"

// smallBody is the largest request body of declared length read whole
// before sending.
const smallBody = 64 << 10

// maxHeldChunked is the largest MaxRequestBody up to which a request body
// of unknown length (chunked) is read whole before anything is sent, so
// one past the bound is refused (413) with nothing sent to the instance
// and one within it leaves with a Content-Length. Over it, such a body is
// streamed, and one that passes the bound is cut off mid-request: the
// instance's connection is closed before the body's last chunk, so it
// never gets a complete request, but its handler may have started.
const maxHeldChunked = 8 << 20

// maxPathLen bounds the path kept in a usage record.
const maxPathLen = 512

// firstRead is the size of the buffer of its own a body that cannot wait
// for its bytes without one (http.Transport's) reads into; a read that
// fills it is followed by reads into a pooled buffer while they fill it.
const firstRead = 1 << 10

// countingBody bounds and counts a request body on its way upstream. The
// transport may read it from its own goroutine, hence the atomics.
type countingBody struct {
	r     io.ReadCloser
	max   int64
	n     atomic.Int64
	limit atomic.Int64 // the bound that was passed (ours or the server's), 0 if none
	bad   atomic.Bool  // the caller's body failed: too large, or cut off
}

var errBodyTooLarge = errors.New("request body too large")

func (c *countingBody) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if total := c.n.Add(int64(n)); total > c.max {
		c.limit.Store(c.max)
		c.bad.Store(true)
		return 0, errBodyTooLarge
	}
	if err != nil && err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			c.limit.Store(mbe.Limit)
		}
		c.bad.Store(true)
	}
	return n, err
}

func (c *countingBody) Close() error { return c.r.Close() }

// failed reports whether the exchange failed on the caller's side of the
// body rather than the instance's.
func (c *countingBody) failed() bool { return c != nil && c.bad.Load() }

func tooLarge(what string, max int64) error {
	return &gpuproxy.Error{Code: gpuproxy.ETOOLARGE,
		Message: what + " is larger than the limit of " + httpapi.HumanBytes(max),
		Details: map[string]any{"limit_bytes": max}}
}

func responseTooLarge(id string, max int64) error {
	return &gpuproxy.Error{Code: CodeUpstream,
		Message: "the instance's response is larger than the limit of " + httpapi.HumanBytes(max),
		Details: map[string]any{"instance_id": id, "limit_bytes": max}}
}

// ServeHTTP is the reverse proxy: ANY /api/v1/proxy/{instance_id}/{path...}
// to the caller's running instance. It must run behind the server's
// authentication and the route's scope, proxy:invoke (see Routes).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	pr, ok := httpapi.PrincipalFrom(r)
	if !ok {
		writeError(w, r, p.log, gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "missing or invalid API key or token"))
		return
	}
	rid := w.Header().Get("X-Request-Id")
	if rid == "" {
		rid = p.requestID()
		w.Header().Set("X-Request-Id", rid)
	}
	id, rest := splitProxyPath(r.URL.EscapedPath())
	u := &gpuproxy.Usage{AccountID: pr.AccountID, InstanceID: id, Method: r.Method, Path: trimPath(rest), At: p.opts.Now(),
		RequestID: rid, KeyID: pr.KeyID}
	// Deferred so a cut stream (which aborts the handler) is recorded too.
	defer func() {
		if u.Status == statusDetached {
			return // the stream's own goroutine records it
		}
		u.Latency = time.Since(start)
		p.finish(u)
	}()
	u.Status = p.serve(w, r, pr.AccountID, pr.KeyID, id, rest, u, start)
}

// serve forwards r and returns the status the caller got.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, acct int64, key, id, rest string, u *gpuproxy.Usage, start time.Time) int {
	if err := p.checkRoute(id, rest, r.ContentLength); err != nil {
		return writeError(w, r, p.log, err)
	}
	t := target{acct: acct, key: key, id: id, method: r.Method, path: rest, query: r.URL.RawQuery, header: r.Header,
		length: r.ContentLength, rid: u.RequestID}
	x, err := p.prepare(r.Context(), &t, u)
	if err != nil {
		return writeError(w, r, p.log, err)
	}
	p.activity.begin(u.RequestID, id, p.opts.Now()) // ended by finish, a stream's when it ends
	x.header["X-Forwarded-For"] = forwardedFor(r)
	price, err := p.priceFor(r.Context(), acct, nil)
	if err != nil {
		return writeError(w, r, p.log, err)
	}
	body, err := p.attachBody(&x, r, u, price.On())
	if err != nil {
		return p.refuse(w, r, nil, err)
	}
	p.askStreamUsage(&x)
	if err := p.reserve(&x, price); err != nil {
		return writeError(w, r, p.log, err)
	}
	ctx := r.Context()
	if p.opts.MaxDuration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.opts.MaxDuration)
		defer cancel()
	}
	resp, err := p.send(ctx, &x)
	if body != nil {
		u.BytesIn = body.n.Load()
	}
	if err != nil {
		return p.refuse(w, r, body, err)
	}
	detached := false
	defer func() {
		if !detached { // a detached stream's goroutine owns the body
			resp.Body.Close()
		}
	}()
	u.TTFB = time.Since(start)
	if err := p.checkAnswer(resp, &x, true); err != nil {
		return writeError(w, r, p.log, err)
	}
	status := p.relay(ctx, w, r, resp, body, u, start, newTap(r.Method, resp, x.addedUsage))
	detached = status == statusDetached
	return status
}

// askStreamUsage makes a streamed completion that does not ask for its
// usage ask for it (Options.StreamUsage "add"): the tap then reads the
// usage chunk and keeps it from the caller.
func (p *Proxy) askStreamUsage(x *exchange) {
	if p.opts.StreamUsage != StreamUsageAdd || x.method != http.MethodPost || len(x.data) == 0 ||
		!strings.HasSuffix(x.path, "completions") {
		return
	}
	if b, ok := askUsage(x.data); ok {
		x.data, x.length, x.addedUsage = b, int64(len(b)), true
	}
}

// checkRoute checks what the reverse proxy's route gives: an instance id,
// a path that cannot climb out of the endpoint's base path, and a declared
// body length within MaxRequestBody.
func (p *Proxy) checkRoute(id, rest string, length int64) error {
	if id == "" || len(id) > 128 {
		return gpuproxy.Invalid("instance_id", "must name one of your running instances")
	}
	if hasDotSegment(rest) {
		return gpuproxy.Invalid("path", "must not contain . or .. segments")
	}
	if length > p.opts.MaxRequestBody {
		return tooLarge("request body", p.opts.MaxRequestBody)
	}
	return nil
}

// attachBody gives x the body of r: a small one, or one of unknown length
// while MaxRequestBody is at most maxHeldChunked, read whole (past the
// bound: 413, nothing sent); a larger one streamed, bounded and counted
// (returned). The caller
// hanging up mid-body is context.Canceled.
func (p *Proxy) attachBody(x *exchange, r *http.Request, u *gpuproxy.Usage, whole bool) (*countingBody, error) {
	switch {
	case r.ContentLength > 0 && (r.ContentLength <= smallBody || whole):
		// A small body is read whole first: the transport then writes
		// headers and body in one packet (it flushes headers separately
		// for a streamed body) and can replay it on a stale keep-alive
		// connection. It is not pooled: the transport may still hold it
		// after the exchange.
		b := make([]byte, r.ContentLength)
		n, err := io.ReadFull(r.Body, b)
		u.BytesIn = int64(n)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, tooLarge("request body", mbe.Limit)
			}
			return nil, context.Canceled
		}
		x.data = b
	case r.ContentLength < 0 && p.opts.MaxRequestBody <= maxHeldChunked:
		b, err := io.ReadAll(io.LimitReader(r.Body, p.opts.MaxRequestBody+1))
		u.BytesIn = int64(len(b))
		var mbe *http.MaxBytesError
		switch {
		case int64(len(b)) > p.opts.MaxRequestBody:
			return nil, tooLarge("request body", p.opts.MaxRequestBody)
		case errors.As(err, &mbe):
			return nil, tooLarge("request body", mbe.Limit)
		case err != nil && r.Context().Err() != nil:
			return nil, context.Canceled
		case err != nil:
			return nil, gpuproxy.Invalid("body", "the request body could not be read to its end")
		}
		x.data, x.length = b, int64(len(b))
	case r.ContentLength != 0:
		x.stream = &countingBody{r: r.Body, max: p.opts.MaxRequestBody}
		return x.stream, nil
	}
	return nil, nil
}

// refuse answers a request that got no answer from the instance: a body
// that failed on the caller's side is the caller's error, a caller that
// went away gets nothing (statusClientClosed is recorded).
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, body *countingBody, err error) int {
	switch {
	case body.failed() && body.limit.Load() > 0:
		return writeError(w, r, p.log, tooLarge("request body", body.limit.Load()))
	case body.failed():
		return writeError(w, r, p.log, gpuproxy.Invalid("body", "the request body could not be read to its end"))
	case errors.Is(err, context.Canceled):
		return statusClientClosed
	}
	return writeError(w, r, p.log, err)
}

// relay passes the instance's answer to the caller and returns its
// status. An answer that fails mid-body (or passes MaxResponseBody) is
// cut, so the caller cannot mistake it for a complete one.
func (p *Proxy) relay(ctx context.Context, w http.ResponseWriter, r *http.Request, resp *http.Response,
	body *countingBody, u *gpuproxy.Usage, start time.Time, tap answerTap) int {
	copyResponseHeader(w.Header(), resp.Header)
	if tap != nil && tap.reframes() {
		// A filtered body's length may change (a usage chunk taken out).
		// Any other answer keeps its length: a complete answer of known
		// length is what lets the server take a keep-alive connection
		// over after it.
		w.Header().Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	u.Status = resp.StatusCode
	if body == nil && resp.StatusCode == http.StatusOK && isEventStream(resp.Header) && p.detach(ctx, w, r, resp, u, start, tap) {
		return statusDetached
	}
	flush := resp.ContentLength < 0 || isEventStream(resp.Header)
	n, err := p.copyBody(w, resp.Body, flush, tap)
	u.BytesOut = n
	applyTap(u, tap)
	if body != nil {
		u.BytesIn = body.n.Load()
	}
	if err != nil && ctx.Err() == nil && !errors.Is(err, h1client.ErrClientGone) {
		p.log.Warn("proxy response cut", "request_id", u.RequestID, "instance_id", u.InstanceID, "bytes", n, "err", err)
		if u.ServiceID != "" && isEventStream(resp.Header) { // a service's token stream ends with an error event
			_, _ = w.Write(streamCutEvent(err))
			return resp.StatusCode
		}
		panic(http.ErrAbortHandler) // ServeHTTP's deferred record still runs
	}
	// Send the answer now rather than after the middleware's bookkeeping
	// (request log, metrics, usage record) on the way out.
	if f, ok := w.(http.Flusher); ok && err == nil {
		f.Flush()
	}
	return resp.StatusCode
}

var errResponseTooLarge = errors.New("response body over the limit")

// emitters pools copyBody's writerEmitters (a tapped answer's; the tap
// keeps it only while Filter or Flush runs).
var emitters = sync.Pool{New: func() any { return new(writerEmitter) }}

// copyBody streams the response body to the caller, flushing every piece
// when the response is a stream. The lean client's bodies wait for their
// next bytes without a buffer (Ready), so a pooled buffer is taken only
// to move bytes that are there; other bodies read into a small buffer of
// their own first and switch to a pooled one while reads fill it.
func (p *Proxy) copyBody(w http.ResponseWriter, body io.Reader, flush bool, tap answerTap) (int64, error) {
	rb, _ := body.(interface{ Ready() })
	var f http.Flusher
	if flush {
		f, _ = w.(http.Flusher)
	}
	var we *writerEmitter
	if tap != nil {
		we = emitters.Get().(*writerEmitter)
		*we = writerEmitter{w: w, max: p.opts.MaxResponseBody}
		defer func() {
			*we = writerEmitter{} // holds no writer while pooled
			emitters.Put(we)
		}()
	}
	var small []byte
	var written int64
	full := false // the last read filled its buffer: more is likely there
	for {
		var bp *[]byte
		var buf []byte
		switch {
		case rb != nil:
			rb.Ready()
			bp = p.lean.Buffers.Get()
			buf = *bp
		case full:
			bp = p.lean.Buffers.Get()
			buf = *bp
		default:
			if small == nil {
				small = make([]byte, firstRead)
			}
			buf = small
		}
		n, rerr := body.Read(buf)
		full = n == len(buf)
		var werr error
		switch {
		case n > 0 && we != nil:
			werr = tap.Filter(buf[:n], we)
			written = we.written
			if werr == nil && f != nil {
				f.Flush()
			}
		case n > 0:
			if written+int64(n) > p.opts.MaxResponseBody {
				werr = errResponseTooLarge
			} else {
				var m int
				m, werr = w.Write(buf[:n])
				written += int64(m)
				if werr != nil {
					werr = h1client.ErrClientGone
				} else if f != nil {
					f.Flush()
				}
			}
		}
		if bp != nil {
			p.lean.Buffers.Put(bp)
		}
		switch {
		case werr != nil:
			return written, werr
		case rerr == io.EOF && we != nil:
			err := tap.Flush(we)
			return we.written, err
		case rerr == io.EOF:
			return written, nil
		case rerr != nil:
			return written, rerr
		}
	}
}

// finish queues the usage record and reports metrics.
func (p *Proxy) finish(u *gpuproxy.Usage) {
	p.activity.end(u.RequestID, p.opts.Now())
	if u.ServiceID != "" {
		p.services.Done(u.ServiceID, u.InstanceID)
	}
	if u.Status >= 100 && u.Status < 600 && u.TTFB > 0 {
		u.Cost = p.opts.Cost // only requests the instance answered are charged
	}
	if p.pricedN.Load() > 0 {
		p.settlePriced(u)
	}
	p.usage.record(*u)
	if p.opts.Metrics != nil {
		p.opts.Metrics.ObserveProxyRequest(u.Status, u.BytesIn, u.BytesOut, u.Latency, u.TTFB)
		if u.PromptTokens > 0 || u.CompletionTokens > 0 {
			p.opts.Metrics.ObserveTokens(u.AccountID, u.Model, u.PromptTokens, u.CompletionTokens)
		}
	}
}

// redirect refuses a redirect that leaves the instance's endpoint (the
// proxy never follows one). With rewrite, a redirect within the endpoint is
// rewritten to the proxy route.
func (p *Proxy) redirect(resp *http.Response, ep *endpoint, id string, rewrite bool) error {
	if resp.StatusCode < 300 || resp.StatusCode > 399 {
		return nil
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return nil
	}
	lu, err := url.Parse(loc)
	offsite := err != nil
	if err == nil && (lu.Scheme != "" || lu.Host != "") {
		if lu.Scheme == "" {
			lu.Scheme = ep.scheme
		}
		offsite = !ep.sameOrigin(lu)
	}
	if offsite {
		resp.Body.Close()
		return &gpuproxy.Error{Code: CodeUpstream,
			Message: "instance " + id + " redirected outside its endpoint; the proxy does not follow redirects off the instance",
			Details: map[string]any{"instance_id": id, "location": truncate(loc, 256)}}
	}
	if !rewrite {
		return nil
	}
	// Within the instance: point the caller at the same path through us.
	path := lu.EscapedPath()
	if !strings.HasPrefix(path, "/") {
		return nil // relative to the current path, already right
	}
	path = strings.TrimPrefix(path, ep.base)
	out := routePrefix + id + path
	if lu.RawQuery != "" {
		out += "?" + lu.RawQuery
	}
	resp.Header.Set("Location", out)
	return nil
}

// splitProxyPath splits "/api/v1/proxy/{id}/{rest}" (escaped) into id and
// "/{rest}", collapsing leading slashes of rest so it can never read as a
// scheme-relative URL.
func splitProxyPath(p string) (id, rest string) {
	i := strings.Index(p, routePrefix)
	if i < 0 {
		return "", "/"
	}
	p = p[i+len(routePrefix):]
	id, rest, found := strings.Cut(p, "/")
	if found && !strings.HasPrefix(rest, "/") {
		return id, p[len(id):] // "/rest" as it came: no copy
	}
	rest = "/" + strings.TrimLeft(rest, "/")
	return id, rest
}

// hasDotSegment reports whether an escaped path has a "." or ".." segment
// (also percent-encoded), which could climb out of an endpoint's base path.
func hasDotSegment(p string) bool {
	if !strings.Contains(p, ".") && !strings.Contains(p, "%2") {
		return false
	}
	if un, err := url.PathUnescape(p); err == nil {
		p = un
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func trimPath(p string) string { return truncate(p, maxPathLen) }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func isEventStream(h http.Header) bool {
	ct := h["Content-Type"]
	return len(ct) > 0 && strings.HasPrefix(ct[0], "text/event-stream")
}

// forwardedFor appends the caller's address to X-Forwarded-For.
func forwardedFor(r *http.Request) []string {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	if prior := r.Header["X-Forwarded-For"]; len(prior) > 0 {
		return []string{strings.Join(prior, ", ") + ", " + ip}
	}
	return []string{ip}
}

// emptyUA keeps the transport from adding its own User-Agent.
var emptyUA = []string{""}

// outboundHeader copies the caller's headers except credentials,
// hop-by-hop headers and those the proxy sets itself.
func outboundHeader(in http.Header, size int) http.Header {
	out := make(http.Header, size)
	conn := in["Connection"]
	for k, vv := range in {
		if dropRequestHeader(k) || (len(conn) > 0 && connectionListed(conn, k)) {
			continue
		}
		out[k] = vv
	}
	if up := in["X-Upstream-Authorization"]; len(up) > 0 {
		out["Authorization"] = up[:1]
	}
	if _, ok := out["User-Agent"]; !ok {
		out["User-Agent"] = emptyUA
	}
	return out
}

// dropRequestHeader lists request headers never forwarded: our
// credentials, hop-by-hop headers, and those the proxy sets.
func dropRequestHeader(k string) bool {
	switch k {
	case "Authorization", "X-Api-Key", "Cookie", "Cookie2", "Proxy-Authorization", "X-Upstream-Authorization",
		"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding",
		"Upgrade", "Expect", "Host", "Content-Length",
		"X-Forwarded-For", "X-Request-Id", "Forwarded", "X-Real-Ip", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// dropResponseHeader lists response headers never passed back: hop-by-hop
// headers, cookies (they would be set on our origin) and the request id
// (the caller gets ours).
func dropResponseHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding",
		"Upgrade", "Set-Cookie", "Set-Cookie2", "X-Request-Id":
		return true
	}
	return false
}

// connectionListed reports whether header k is named by a Connection
// header (and so hop-by-hop).
func connectionListed(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == k {
				return true
			}
		}
	}
	return false
}

func copyResponseHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if dropResponseHeader(k) || (len(conn) > 0 && connectionListed(conn, k)) {
			continue
		}
		dst[k] = vv
	}
}
