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
// reverse proxy. targetURL must have the scheme, host and port of the
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
	u := &Usage{AccountID: pr.AccountID, At: p.opts.Now(), RequestID: p.requestID()}
	defer func() {
		if err != nil {
			u.Status = HTTPStatus(err)
			if errors.Is(err, context.Canceled) {
				u.Status = statusClientClosed
			}
		} else {
			u.Status = status
		}
		u.Latency = time.Since(start)
		if pr.AccountID != 0 {
			p.finish(u)
		}
	}()
	if err := pr.Require(gpuproxy.ScopeProxyInvoke); err != nil {
		return 0, nil, nil, err
	}
	method = strings.ToUpper(strings.TrimSpace(method))
	if method == "" {
		method = http.MethodGet
		if len(body) > 0 {
			method = http.MethodPost
		}
	}
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead,
		http.MethodOptions:
	default:
		return 0, nil, nil, gpuproxy.Invalid("method", "must be GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS")
	}
	u.Method = method
	if int64(len(body)) > p.opts.MaxRequestBody {
		return 0, nil, nil, tooLarge("body", p.opts.MaxRequestBody)
	}
	tu, err := url.Parse(strings.TrimSpace(targetURL))
	if err != nil || (tu.Scheme != "http" && tu.Scheme != "https") || tu.Host == "" || tu.Opaque != "" {
		return 0, nil, nil, gpuproxy.Invalid("target_url", "must be an absolute http or https URL")
	}
	if tu.User != nil {
		return 0, nil, nil, gpuproxy.Invalid("target_url", "must not carry credentials")
	}
	path := tu.EscapedPath()
	u.Path = trimPath(path)
	if hasDotSegment(path) {
		return 0, nil, nil, gpuproxy.Invalid("target_url", "path must not contain . or .. segments")
	}
	eps, err := p.endpoints.list(ctx, pr.AccountID, p.opts.Now())
	if err != nil {
		return 0, nil, nil, err
	}
	var ep *endpoint
	for _, ie := range eps {
		if ie.ep.sameOrigin(tu) {
			ep, u.InstanceID = ie.ep, ie.id
			break
		}
	}
	if ep == nil {
		return 0, nil, nil, &gpuproxy.Error{Code: gpuproxy.EFORBIDDEN,
			Message: "target_url must be the endpoint (scheme, host and port) of one of your running instances; " +
				"list them with list_instances",
			Details: map[string]any{"field": "target_url"}}
	}
	h := make(http.Header, len(headers)+2)
	for k, v := range headers {
		if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
			return 0, nil, nil, gpuproxy.Invalid("headers", "%q is not a valid header", truncate(k, 64))
		}
		h[http.CanonicalHeaderKey(k)] = []string{v}
	}
	x := exchange{acct: pr.AccountID, instanceID: u.InstanceID, ep: ep, method: method, path: "/" + strings.TrimLeft(path, "/"),
		query: tu.RawQuery, header: outboundHeader(h, len(h)+1), length: int64(len(body))}
	x.header["X-Request-Id"] = []string{u.RequestID}
	x.data = body
	u.BytesIn = int64(len(body))
	ctx, cancel := context.WithTimeout(ctx, p.opts.UpstreamTimeout)
	defer cancel()
	resp, err := p.send(ctx, &x)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	u.TTFB = time.Since(start)
	if err := p.redirect(resp, ep, u.InstanceID, false); err != nil {
		return 0, nil, nil, err
	}
	if resp.ContentLength > p.opts.MaxResponseBody {
		return 0, nil, nil, responseTooLarge(u.InstanceID, p.opts.MaxResponseBody)
	}
	respBody, err = io.ReadAll(io.LimitReader(resp.Body, p.opts.MaxResponseBody+1))
	u.BytesOut = int64(len(respBody))
	if err != nil {
		return 0, nil, nil, upstreamErr(u.InstanceID, p.opts.UpstreamTimeout, err)
	}
	if int64(len(respBody)) > p.opts.MaxResponseBody {
		return 0, nil, nil, responseTooLarge(u.InstanceID, p.opts.MaxResponseBody)
	}
	respHeaders = make(map[string]string, len(resp.Header))
	conn := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if len(vv) == 0 || dropResponseHeader(k) || (len(conn) > 0 && connectionListed(conn, k)) {
			continue
		}
		respHeaders[k] = vv[0]
	}
	respHeaders["X-Request-Id"] = u.RequestID
	return resp.StatusCode, respHeaders, respBody, nil
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
