package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/h1client"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Services routes the OpenAI-compatible endpoint's requests to services'
// replicas (services.Manager implements it).
type Services interface {
	// Pick returns the service serving model for the account and one of
	// its ready replicas (never exclude), waiting up to the service's
	// queue timeout when none is ready; unknown model: not found. Each
	// pick is ended by Done.
	Pick(ctx context.Context, accountID int64, model, exclude string) (gpuproxy.ServiceRoute, error)
	Done(serviceID, instanceID string)
	// Models lists the account's active services.
	Models(ctx context.Context, accountID int64) ([]gpuproxy.Service, error)
}

// openAIPrefix is where the services' endpoint is served.
const openAIPrefix = "/v1/"

// The endpoint's paths.
const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
	pathEmbeddings  = "/v1/embeddings"
	pathModels      = "/v1/models"
)

// openAI is the services' OpenAI-compatible endpoint: POST
// /v1/chat/completions, /v1/completions and /v1/embeddings go to a ready
// replica of the service whose model the body names; GET /v1/models lists
// the caller's services. Errors use OpenAI's shape.
type openAI struct{ p *Proxy }

// OpenAIRoutes is the services' endpoint as a route table (a Prefix
// entry: the proxy's fast path).
func (p *Proxy) openAIRoutes() []httpapi.Route {
	if p.services == nil {
		return nil
	}
	return []httpapi.Route{{Method: "*", Path: "/v1/*", Prefix: openAIPrefix, Handler: openAI{p},
		Auth: httpapi.AuthCredentials, Scope: gpuproxy.ScopeProxyInvoke}}
}

// WriteRefusal implements httpapi.RefusalWriter: the pipeline's 401, 403,
// 413 and 429 in OpenAI's error shape, as its SDKs read them.
func (o openAI) WriteRefusal(w http.ResponseWriter, r *http.Request, status int, err error) {
	writeOpenAI(w, status, err)
}

func (o openAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := o.p
	start := time.Now()
	pr, ok := httpapi.PrincipalFrom(r)
	if !ok {
		writeOpenAI(w, http.StatusUnauthorized, gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "missing or invalid API key or token"))
		return
	}
	rid := w.Header().Get("X-Request-Id")
	if rid == "" {
		rid = p.requestID()
		w.Header().Set("X-Request-Id", rid)
	}
	path := r.URL.Path
	switch {
	case path == pathModels && r.Method == http.MethodGet:
		o.models(w, r, pr.AccountID)
		return
	case strings.HasPrefix(path, pathModels+"/") && r.Method == http.MethodGet:
		o.model(w, r, pr.AccountID, strings.TrimPrefix(path, pathModels+"/"))
		return
	case strings.HasPrefix(path, pathModels+"/"):
		w.Header().Set("Allow", http.MethodGet)
		writeOpenAI(w, http.StatusMethodNotAllowed, gpuproxy.Errorf(gpuproxy.EINVALID, "%s takes GET", truncate(path, 200)))
		return
	case path == pathChat || path == pathCompletions || path == pathEmbeddings:
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeOpenAI(w, http.StatusMethodNotAllowed, gpuproxy.Errorf(gpuproxy.EINVALID, "%s takes POST", path))
			return
		}
	case path == pathModels:
		w.Header().Set("Allow", http.MethodGet)
		writeOpenAI(w, http.StatusMethodNotAllowed, gpuproxy.Errorf(gpuproxy.EINVALID, "%s takes GET", path))
		return
	default:
		writeOpenAI(w, http.StatusNotFound, gpuproxy.Errorf(gpuproxy.ENOTFOUND,
			"%s is not served: use POST /v1/chat/completions, /v1/completions, /v1/embeddings, GET /v1/models or "+
				"GET /v1/models/{model}", truncate(path, 200)))
		return
	}
	u := &gpuproxy.Usage{AccountID: pr.AccountID, Method: r.Method, Path: path, At: p.opts.Now(), RequestID: rid,
		KeyID: pr.KeyID}
	defer func() {
		if u.Status == statusDetached {
			return // the stream's own goroutine records it
		}
		u.Latency = time.Since(start)
		p.finish(u)
	}()
	u.Status = o.serve(w, r, pr.AccountID, pr.KeyID, u, start)
}

// modelOnly reads a request body's model, and whether it has messages.
type modelOnly struct {
	Model    *string  `json:"model"`
	Messages jsonKind `json:"messages"`
}

// read reads body into mo as json.Unmarshal does, and returns its error.
// A body whose model is a plain string (ASCII, no escapes) or null is read
// by topFields, without encoding/json's reflection; any other is left to
// json.Unmarshal. FuzzModelOnly holds the two equal.
func (mo *modelOnly) read(body []byte) error {
	var m modelOnly
	plain := true
	if topFields(body, func(k, v []byte) {
		switch {
		case fieldIs(k, "model"):
			switch {
			case v[0] == 'n':
				m.Model = nil
			case v[0] == '"' && plainString(v):
				s := string(v[1 : len(v)-1])
				m.Model = &s
			default:
				plain = false
			}
		case fieldIs(k, "messages"):
			_ = m.Messages.UnmarshalJSON(v)
		}
	}) && plain {
		*mo = m
		return nil
	}
	*mo = modelOnly{}
	return json.Unmarshal(body, mo)
}

// plainString reports whether v, a valid JSON string, is read as its bytes
// between the quotes: no escapes, and ASCII (json.Unmarshal replaces
// invalid UTF-8).
func plainString(v []byte) bool {
	for _, c := range v {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// jsonKind records the first byte of a JSON value (0: absent) without
// keeping the value.
type jsonKind byte

// UnmarshalJSON implements json.Unmarshaler.
func (k *jsonKind) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] != 'n' { // null is as good as absent
		*k = jsonKind(b[0])
	}
	return nil
}

// serve routes one inference request and returns the status the caller
// got.
func (o openAI) serve(w http.ResponseWriter, r *http.Request, acct int64, key string, u *gpuproxy.Usage, start time.Time) int {
	p := o.p
	body, err := o.readBody(r)
	u.BytesIn = int64(len(body))
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return statusClientClosed
		}
		return writeOpenAIErr(w, p, err)
	}
	var mo modelOnly
	if err := mo.read(body); err != nil {
		return writeOpenAIErr(w, p, gpuproxy.Invalid("body", "must be a JSON object: %s", jsonProblem(err)))
	}
	if mo.Model == nil || *mo.Model == "" {
		return writeOpenAIErr(w, p, gpuproxy.Invalid("model", "is required: the name of one of your services' models (GET /v1/models)"))
	}
	// A chat without messages is refused here, in OpenAI's words, before
	// it costs a replica's time.
	switch {
	case r.URL.Path != pathChat:
	case mo.Messages == 0:
		return writeOpenAIErr(w, p, gpuproxy.Invalid("messages", "is required: a list of messages, e.g. "+
			`[{"role":"user","content":"hello"}]`))
	case mo.Messages != '[':
		return writeOpenAIErr(w, p, gpuproxy.Invalid("messages", "must be an array of messages, e.g. "+
			`[{"role":"user","content":"hello"}]`))
	}
	u.Model = truncate(*mo.Model, 200)
	ctx := r.Context()
	if p.opts.MaxDuration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.opts.MaxDuration)
		defer cancel()
	}
	exclude := ""
	var cause error // why the first replica tried could not serve
	for try := 0; ; try++ {
		rt, err := p.services.Pick(ctx, acct, *mo.Model, exclude)
		if err != nil {
			if ctx.Err() != nil && r.Context().Err() != nil {
				return statusClientClosed
			}
			if cause != nil && gpuproxy.ErrorCode(err) == gpuproxy.EUNAVAILABLE {
				// No other replica: the first one's failure says more
				// (e.g. spending that cannot be verified right now).
				err = cause
			}
			return writeOpenAIErr(w, p, err)
		}
		u.ServiceID, u.InstanceID = rt.ServiceID, rt.InstanceID
		status, retry := o.exchange(ctx, w, r, acct, key, rt, body, u, start, try == 0)
		if retry == nil {
			return status
		}
		exclude, cause = rt.InstanceID, retry
	}
}

// exchange sends the request to one replica and relays its answer. It
// reports retry, the reason (and writes nothing), when the replica could
// not be reached or answered a 5xx without a body, and may be retried
// elsewhere; the pick is then ended here. Otherwise finish ends it with
// the usage record (a detached stream's when the stream ends).
func (o openAI) exchange(ctx context.Context, w http.ResponseWriter, r *http.Request, acct int64, key string, rt gpuproxy.ServiceRoute,
	body []byte, u *gpuproxy.Usage, start time.Time, canRetry bool) (status int, retry error) {
	p := o.p
	svc, id := rt.ServiceID, rt.InstanceID
	again := func(cause error) (int, error) {
		p.services.Done(svc, id)
		u.ServiceID, u.InstanceID = "", ""
		return 0, cause
	}
	t := target{acct: acct, key: key, id: id, method: http.MethodPost, path: r.URL.Path, query: r.URL.RawQuery,
		header: r.Header, length: int64(len(body)), rid: u.RequestID}
	x, err := p.prepare(ctx, &t, u)
	if err != nil {
		if canRetry && gpuproxy.ErrorCode(err) != gpuproxy.EFORBIDDEN {
			return again(err) // the replica's instance is gone: another may serve
		}
		return writeOpenAIErr(w, p, err), nil
	}
	x.data, x.length = body, int64(len(body))
	p.askStreamUsage(&x)
	price, err := p.priceFor(ctx, acct, rt.TokenPrice)
	if err == nil {
		err = p.reserve(&x, price)
	}
	if err != nil {
		p.services.Done(svc, id)
		u.ServiceID, u.InstanceID = "", ""
		return writeOpenAIErr(w, p, err), nil
	}
	p.activity.begin(u.RequestID, id, p.opts.Now()) // ended by finish, a stream's when it ends
	x.header["X-Forwarded-For"] = forwardedFor(r)
	resp, err := p.send(ctx, &x)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return statusClientClosed, nil
		}
		// Not reached (a connect failure), or not sent at all (its
		// breaker is open): another replica may serve.
		if code := gpuproxy.ErrorCode(err); canRetry && (code == CodeUpstream || code == gpuproxy.EUNAVAILABLE) {
			p.activity.end(u.RequestID, p.opts.Now())
			return again(err)
		}
		return writeOpenAIErr(w, p, err), nil
	}
	if canRetry && resp.StatusCode >= 500 && resp.ContentLength == 0 {
		resp.Body.Close()
		p.activity.end(u.RequestID, p.opts.Now())
		p.unprice(u.RequestID, id)
		return again(&gpuproxy.Error{Code: CodeUpstream,
			Message: "the replica's instance answered " + strconv.Itoa(resp.StatusCode) + " without a body"})
	}
	detached := false
	defer func() {
		if !detached { // a detached stream's goroutine owns the body
			resp.Body.Close()
		}
	}()
	u.TTFB = time.Since(start)
	if err := p.checkAnswer(resp, &x, false); err != nil {
		return writeOpenAIErr(w, p, err), nil
	}
	status = p.relay(ctx, w, r, resp, nil, u, start, newTap(http.MethodPost, resp, x.addedUsage))
	detached = status == statusDetached
	return status, nil
}

func (o openAI) readBody(r *http.Request) ([]byte, error) {
	max := o.p.opts.MaxRequestBody
	if r.ContentLength > max {
		return nil, tooLarge("request body", max)
	}
	var b []byte
	var err error
	if r.ContentLength > 0 {
		b = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, b)
	} else {
		b, err = io.ReadAll(io.LimitReader(r.Body, max+1))
		if int64(len(b)) > max {
			return nil, tooLarge("request body", max)
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, tooLarge("request body", mbe.Limit)
	case err != nil && r.Context().Err() != nil:
		return nil, context.Canceled
	case err != nil:
		return nil, gpuproxy.Invalid("body", "the request body could not be read to its end")
	}
	return b, nil
}

func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field == "" {
		return "got a JSON " + te.Value
	}
	return err.Error()
}

// models answers GET /v1/models: the caller's services, as OpenAI lists
// models.
func (o openAI) models(w http.ResponseWriter, r *http.Request, acct int64) {
	svcs, err := o.p.services.Models(r.Context(), acct)
	if err != nil {
		writeOpenAIErr(w, o.p, err)
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: make([]model, 0, len(svcs))}
	for _, s := range svcs {
		out.Data = append(out.Data, model{ID: s.Model, Object: "model", Created: s.CreatedAt.Unix(), OwnedBy: s.Name})
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// model answers GET /v1/models/{model}: one of the caller's services'
// models, as OpenAI retrieves a model, or 404 model_not_found.
func (o openAI) model(w http.ResponseWriter, r *http.Request, acct int64, id string) {
	svcs, err := o.p.services.Models(r.Context(), acct)
	if err != nil {
		writeOpenAIErr(w, o.p, err)
		return
	}
	for _, s := range svcs {
		if s.Model != id {
			continue
		}
		b, _ := json.Marshal(struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		}{ID: s.Model, Object: "model", Created: s.CreatedAt.Unix(), OwnedBy: s.Name})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return
	}
	writeOpenAIErr(w, o.p, &gpuproxy.Error{Code: gpuproxy.ENOTFOUND, Message: fmt.Sprintf(
		"The model %q does not exist: none of your services serves it (GET /v1/models lists them)", truncate(id, 200)),
		Details: map[string]any{"field": "model"}})
}

// writeOpenAIErr writes err in OpenAI's error shape with its status and
// returns the status; internal errors are logged.
func writeOpenAIErr(w http.ResponseWriter, p *Proxy, err error) int {
	status := HTTPStatus(err)
	switch code := gpuproxy.ErrorCode(err); code {
	case gpuproxy.EINTERNAL:
		p.log.Error("service request failed", "request_id", w.Header().Get("X-Request-Id"), "err", err)
	case gpuproxy.EUNAVAILABLE, CodeUpstream, CodeUpstreamTimeout:
		p.log.Warn("service request failed", "request_id", w.Header().Get("X-Request-Id"), "code", code, "err", err)
	}
	writeOpenAI(w, status, err)
	return status
}

// openAIType is OpenAI's error type for each of our codes.
func openAIType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusPaymentRequired:
		return "insufficient_quota"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusNotFound || status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}

// writeOpenAI writes {"error":{"message","type","code","param"}} with
// status; a retry_after_seconds detail becomes Retry-After.
func writeOpenAI(w http.ResponseWriter, status int, err error) {
	code := gpuproxy.ErrorCode(err)
	d := gpuproxy.ErrorDetails(err)
	if code == gpuproxy.ENOTFOUND && d["field"] == "model" {
		code = "model_not_found"
	}
	if s, ok := d["retry_after_seconds"].(int); ok {
		w.Header().Set("Retry-After", strconv.Itoa(s))
	}
	e := struct {
		Message string         `json:"message"`
		Type    string         `json:"type"`
		Code    string         `json:"code"`
		Param   any            `json:"param"`
		Details map[string]any `json:"details,omitempty"`
	}{Message: gpuproxy.ErrorMessage(err), Type: openAIType(status), Code: code, Param: d["field"]}
	if code != gpuproxy.EINTERNAL {
		e.Details = d
	}
	b, _ := json.Marshal(struct {
		Error any `json:"error"`
	}{e})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Probe checks a replica's readiness (services.Prober): GET path on the
// account's running instance's endpoint, through the checked dialer,
// answers 2xx within timeout.
func (p *Proxy) Probe(ctx context.Context, accountID int64, instanceID, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := target{acct: accountID, id: instanceID, method: http.MethodGet, path: path, header: http.Header{}, rid: p.requestID()}
	var u gpuproxy.Usage
	x, err := p.prepare(ctx, &t, &u)
	if err != nil {
		return err
	}
	var resp *http.Response
	if x.ep.scheme == "http" {
		resp, err = p.lean.RoundTrip(ctx, &h1client.Request{Addr: x.ep.addr, Host: x.ep.host, Method: x.method,
			Path: x.path, Header: x.header})
	} else {
		resp, err = p.transport.RoundTrip(p.stdRequest(ctx, &x))
	}
	if err != nil {
		return upstreamErr(instanceID, timeout, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return gpuproxy.Errorf(CodeUpstream, "GET %s answered %d", path, resp.StatusCode)
	}
	return nil
}
