package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Call sends one request to targetURL for the MCP tool
// proxy_inference_request, over the same checks and forwarder as the
// reverse proxy. Its caller checked pr's scope: the tool table names
// proxy:invoke, which the MCP server enforces before the tool runs. targetURL must have the scheme, host and port of the
// recorded endpoint of one of p's running instances; anything else is
// refused (forbidden) before any byte is sent. method defaults to POST with
// a body and GET without. headers go through the same filter as the
// reverse proxy's (credentials and hop-by-hop headers dropped;
// X-Upstream-Authorization becomes Authorization). The whole exchange is
// bounded by UpstreamTimeout and the response body by MaxResponseBody.
//
// An answer from the instance, whatever its status (5xx included), is
// returned with err == nil; err is set when there was no usable answer, with
// the same codes as the reverse proxy (HTTPStatus maps them).
func (p *Proxy) Call(ctx context.Context, pr gpuproxy.Principal, targetURL, method string, headers map[string]string,
	body []byte) (status int, respHeaders map[string]string, respBody []byte, err error) {
	start := time.Now()
	u := &gpuproxy.Usage{AccountID: pr.AccountID, At: p.opts.Now(), RequestID: p.requestID()}
	defer func() { p.callDone(u, start, status, err) }()
	t, err := p.callTarget(pr, targetURL, method, headers, body, u)
	if err != nil {
		return 0, nil, nil, err
	}
	x, err := p.prepare(ctx, &t, u)
	if err != nil {
		return 0, nil, nil, err
	}
	x.data, u.BytesIn = body, int64(len(body))
	ctx, cancel := context.WithTimeout(ctx, p.opts.UpstreamTimeout)
	defer cancel()
	resp, err := p.send(ctx, &x)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	u.TTFB = time.Since(start)
	if err := p.checkAnswer(resp, &x, false); err != nil {
		return 0, nil, nil, err
	}
	respBody, err = io.ReadAll(io.LimitReader(resp.Body, p.opts.MaxResponseBody+1))
	u.BytesOut = int64(len(respBody))
	switch {
	case err != nil:
		return 0, nil, nil, upstreamErr(x.instanceID, p.opts.UpstreamTimeout, err)
	case int64(len(respBody)) > p.opts.MaxResponseBody:
		return 0, nil, nil, responseTooLarge(x.instanceID, p.opts.MaxResponseBody)
	}
	return resp.StatusCode, answerHeader(resp.Header, u.RequestID), respBody, nil
}

// callTarget reads Call's arguments into a target, checking what only Call
// takes: the method, the body's size and the target URL (an
// absolute http or https URL without credentials or dot segments). u gets
// the method and the path as each passes.
func (p *Proxy) callTarget(pr gpuproxy.Principal, targetURL, method string, headers map[string]string, body []byte,
	u *gpuproxy.Usage) (target, error) {
	method, err := callMethod(method, len(body) > 0)
	if err != nil {
		return target{}, err
	}
	u.Method = method
	if int64(len(body)) > p.opts.MaxRequestBody {
		return target{}, tooLarge("body", p.opts.MaxRequestBody)
	}
	tu, err := url.Parse(strings.TrimSpace(targetURL))
	if err != nil || (tu.Scheme != "http" && tu.Scheme != "https") || tu.Host == "" || tu.Opaque != "" {
		return target{}, gpuproxy.Invalid("target_url", "must be an absolute http or https URL")
	}
	if tu.User != nil {
		return target{}, gpuproxy.Invalid("target_url", "must not carry credentials")
	}
	path := tu.EscapedPath()
	u.Path = trimPath(path)
	if hasDotSegment(path) {
		return target{}, gpuproxy.Invalid("target_url", "path must not contain . or .. segments")
	}
	return target{acct: pr.AccountID, key: pr.KeyID, origin: tu, method: method, path: "/" + strings.TrimLeft(path, "/"),
		query: tu.RawQuery, fields: headers, length: int64(len(body)), rid: u.RequestID}, nil
}

// callMethod is Call's method: GET, or POST with a body, by default.
func callMethod(method string, hasBody bool) (string, error) {
	method = strings.ToUpper(strings.TrimSpace(method))
	if method == "" {
		method = http.MethodGet
		if hasBody {
			method = http.MethodPost
		}
	}
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead,
		http.MethodOptions:
		return method, nil
	}
	return "", gpuproxy.Invalid("method", "must be GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS")
}

// callDone records a Call's usage: the instance's status, or the one its
// error maps to (statusClientClosed when the caller gave up).
func (p *Proxy) callDone(u *gpuproxy.Usage, start time.Time, status int, err error) {
	u.Status = status
	if err != nil {
		u.Status = HTTPStatus(err)
		if errors.Is(err, context.Canceled) {
			u.Status = statusClientClosed
		}
	}
	u.Latency = time.Since(start)
	if u.AccountID != 0 {
		p.finish(u)
	}
}

// answerHeader is Call's view of the instance's response headers: the
// first value of each, less hop-by-hop headers and cookies, with the
// request id.
func answerHeader(h http.Header, rid string) map[string]string {
	out := make(map[string]string, len(h))
	conn := h["Connection"]
	for k, vv := range h {
		if len(vv) == 0 || dropResponseHeader(k) || (len(conn) > 0 && connectionListed(conn, k)) {
			continue
		}
		out[k] = vv[0]
	}
	out["X-Request-Id"] = rid
	return out
}

// validHeaderName reports whether k is an HTTP token (RFC 9110 §5.1).
func validHeaderName(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}
