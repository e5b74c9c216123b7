package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/h1client"
)

// target is a request as an entry point (ServeHTTP or Call) read and
// checked it: the instance it names and what to send there.
type target struct {
	acct int64
	key  string // the calling API key (its own windows, if any, apply)
	// The instance: by id (the reverse proxy's route), or as the one whose
	// endpoint has origin's scheme, host and port (Call's target URL).
	id     string
	origin *url.URL
	method string
	// path is escaped: below the endpoint's base path when id names the
	// instance, the whole path (base path included) when origin does.
	path   string
	query  string
	header http.Header       // the caller's headers as net/http read them,
	fields map[string]string // or as Call got them, checked by prepare
	length int64             // the body's declared length (-1: unknown)
	rid    string
}

// exchange is one request to an instance, as prepare builds it (with a
// body attached) and send sends it.
type exchange struct {
	acct       int64
	key        string
	instanceID string
	ep         *endpoint
	method     string
	path       string // escaped path sent upstream, base path included
	query      string
	header     http.Header
	data       []byte        // an in-memory body (or none)
	stream     *countingBody // a streamed body instead, of length (-1: unknown)
	length     int64
	addedUsage bool // the body asks for the stream's usage because we added it (askStreamUsage)
	rid        string
	// cost is what a token-priced request is admitted for (reserve), with
	// price its pending settlement; both unset otherwise (Options.Cost).
	cost  gpuproxy.Micros
	price *pricedCall
}

// prepare is the step ServeHTTP and Call share once each has checked what
// only it takes: it finds the caller's running instance t names (nothing
// else is reachable) and builds the exchange, with the caller's headers
// less credentials and hop-by-hop ones, and the request id. u gets the
// instance's id. Nothing is sent, and the body is left to each entry point.
func (p *Proxy) prepare(ctx context.Context, t *target, u *gpuproxy.Usage) (exchange, error) {
	ep, id, err := p.find(ctx, t)
	if err != nil {
		return exchange{}, err
	}
	u.InstanceID = id
	h := t.header
	if t.fields != nil {
		if h, err = headerOf(t.fields); err != nil {
			return exchange{}, err
		}
	}
	x := exchange{acct: t.acct, key: t.key, instanceID: id, ep: ep, method: t.method, path: t.path, query: t.query,
		header: outboundHeader(h, len(h)+2), length: t.length}
	if t.origin == nil {
		if x.path = ep.base + t.path; x.path == "" {
			x.path = "/"
		}
	}
	x.header["X-Request-Id"] = []string{t.rid}
	x.rid = t.rid
	return x, nil
}

// find returns the caller's running instance t names, and its endpoint.
func (p *Proxy) find(ctx context.Context, t *target) (*endpoint, string, error) {
	if t.origin == nil {
		ep, err := p.endpoints.lookup(ctx, t.acct, t.id, p.opts.Now())
		return ep, t.id, err
	}
	eps, err := p.endpoints.list(ctx, t.acct, p.opts.Now())
	if err != nil {
		return nil, "", err
	}
	for _, ie := range eps {
		if ie.ep.sameOrigin(t.origin) {
			return ie.ep, ie.id, nil
		}
	}
	return nil, "", &gpuproxy.Error{Code: gpuproxy.EFORBIDDEN,
		Message: "target_url must be the endpoint (scheme, host and port) of one of your running instances; " +
			"list them with list_instances",
		Details: map[string]any{"field": "target_url"}}
}

// headerOf checks and canonicalizes headers given as a map (Call's).
func headerOf(fields map[string]string) (http.Header, error) {
	h := make(http.Header, len(fields)+2)
	for k, v := range fields {
		if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
			return nil, gpuproxy.Invalid("headers", "%q is not a valid header", truncate(k, 64))
		}
		h[http.CanonicalHeaderKey(k)] = []string{v}
	}
	return h, nil
}

// send checks the guard rail and the instance's breaker, then sends the
// request. Nothing reaches the instance before both pass. The response, if
// any, has its headers read and its body unread. Plain-HTTP endpoints with
// an in-memory body take the lean client; the rest (https, streamed bodies)
// the tuned http.Transport.
func (p *Proxy) send(ctx context.Context, x *exchange) (*http.Response, error) {
	cost := p.opts.Cost
	if x.price != nil {
		cost = x.cost
	}
	pass, err := p.gate.AdmitKey(ctx, x.acct, x.key, cost)
	if err != nil {
		return nil, err
	}
	done, err := p.breakers.allow(x.instanceID)
	if err != nil {
		pass.Done(x.instanceID, false)
		return nil, err
	}
	var resp *http.Response
	if x.ep.scheme == "http" && x.stream == nil {
		resp, err = p.lean.RoundTrip(ctx, &h1client.Request{Addr: x.ep.addr, Host: x.ep.host, Method: x.method,
			Path: x.path, Query: x.query, Header: x.header, Body: x.data, Spare: x.wantsStream()})
	} else {
		resp, err = p.transport.RoundTrip(p.stdRequest(ctx, x))
	}
	// Only a call the instance answered is charged (as in finish); a
	// token-priced one when its answer ends, at its counted tokens.
	if x.price != nil && err == nil {
		x.price.pass = pass
		p.pricedN.Add(1)
		p.priced.Store(x.rid, x.price)
	} else {
		pass.Done(x.instanceID, err == nil)
	}
	switch {
	case err != nil && (x.stream.failed() || ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded)):
		// The caller went away or sent a bad body: says nothing about
		// the instance.
		done(context.Canceled)
		return nil, context.Canceled
	case err != nil:
		done(err)
		return nil, p.noteOverload(x, upstreamErr(x.instanceID, p.opts.UpstreamTimeout, err))
	case resp.StatusCode >= 500:
		done(errUpstream5xx)
	default:
		done(nil)
	}
	return resp, nil
}

// wantsStream reports whether x asks for a token stream: its caller
// accepts text/event-stream, or its body is a JSON object with "stream":
// true. Such a request has the lean client dial the instance's next
// connection ahead (h1client.Request.Spare): streams hold their
// connection for their whole length, so a burst of them would otherwise
// each wait on a connect before its first byte.
func (x *exchange) wantsStream() bool {
	if x.addedUsage {
		return true
	}
	for _, v := range x.header["Accept"] {
		if strings.Contains(v, "text/event-stream") {
			return true
		}
	}
	if !bytes.Contains(x.data, []byte(`"stream"`)) {
		return false
	}
	var r streamRequest
	return r.read(x.data) && r.Stream
}

// checkAnswer checks the head of the instance's answer to x: a redirect
// off the instance is refused (with rewrite, one within it is pointed at
// the proxy route), and so is a declared length over MaxResponseBody.
func (p *Proxy) checkAnswer(resp *http.Response, x *exchange, rewrite bool) error {
	if err := p.redirect(resp, x.ep, x.instanceID, rewrite); err != nil {
		return err
	}
	if resp.ContentLength > p.opts.MaxResponseBody {
		return responseTooLarge(x.instanceID, p.opts.MaxResponseBody)
	}
	return nil
}

// stdRequest builds the http.Transport request for x.
func (p *Proxy) stdRequest(ctx context.Context, x *exchange) *http.Request {
	req := &http.Request{
		Method:     x.method,
		URL:        &url.URL{Scheme: x.ep.scheme, Host: x.ep.host, Opaque: x.path, RawQuery: x.query},
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     x.header,
		Host:       x.ep.host,
	}
	switch {
	case x.stream != nil:
		req.Body, req.ContentLength = x.stream, x.length
	case len(x.data) > 0:
		data := x.data
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(data)), int64(len(data))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	}
	return req.WithContext(ctx)
}
