package alerts

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

// The sender's own bounds, beside Options.Timeout (one attempt):
const (
	// idleConnTimeout is how long a connection to a webhook stays pooled.
	idleConnTimeout = 90 * time.Second
	// claimSlack is how long a claim outlives its attempts' Timeout, to
	// record the outcome.
	claimSlack = 5 * time.Second
	// finishTimeout bounds recording a delivery's outcome.
	finishTimeout = 10 * time.Second
)

// sender claims due deliveries and POSTs them.
type sender struct {
	s      *Service
	client *http.Client
}

func newSender(s *Service) *sender {
	d := &netpolicy.Dialer{Allow: s.allow, Resolver: s.opts.Resolver, Dial: s.opts.Dial, Timeout: s.opts.Timeout}
	tr := &http.Transport{
		Proxy:                 nil, // never an environment proxy: it would bypass the address check
		DialContext:           d.DialContext,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   s.opts.Timeout,
		ResponseHeaderTimeout: s.opts.Timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       idleConnTimeout,
		ForceAttemptHTTP2:     true,
	}
	return &sender{s: s, client: &http.Client{Transport: tr, Timeout: s.opts.Timeout,
		// A redirect is an answer, not a delivery: following it would
		// send the signed body somewhere the account did not set.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (d *sender) run(ctx context.Context) {
	t := time.NewTicker(d.s.opts.SendInterval)
	defer t.Stop()
	for {
		for {
			n, err := d.SendDue(ctx)
			if err != nil && ctx.Err() == nil {
				d.s.log.Error("sending budget alerts", "err", err)
			}
			if err != nil || n < d.s.opts.Batch {
				break // a full batch: there may be more due
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.s.wake:
		}
	}
}

// SendDue claims the deliveries due now (at most Options.Batch), attempts
// each once, concurrently, and records the outcomes; it returns how many
// it claimed. Another replica never claims the same deliveries.
func (s *Service) SendDue(ctx context.Context) (int, error) { return s.sender.SendDue(ctx) }

func (d *sender) SendDue(ctx context.Context) (int, error) {
	now := d.s.opts.Now()
	// A claim outlives its attempt (bounded by Timeout) with room to
	// record the outcome; only a crashed sender's claim expires.
	until := now.Add(2*d.s.opts.Timeout + claimSlack)
	ds, err := d.s.store.ClaimAlertDeliveries(ctx, now, until, d.s.opts.Batch)
	if err != nil {
		return 0, err
	}
	// Attempts in flight finish even when ctx ends (each is bounded by
	// Timeout), so a shutdown leaves no delivery claimed and unsent.
	actx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, dl := range ds {
		wg.Go(func() { d.attempt(actx, dl) })
	}
	wg.Wait()
	return len(ds), nil
}

// attempt POSTs one claimed delivery and records the outcome.
func (d *sender) attempt(ctx context.Context, dl gpuproxy.AlertDelivery) {
	o := d.post(ctx, dl)
	o.At = d.s.opts.Now()
	if o.Status == gpuproxy.AlertPending {
		wait := d.backoff(dl.Attempts)
		if o.At.Add(wait).After(dl.Event.At.Add(d.s.opts.RetryFor)) {
			o.Status = gpuproxy.AlertFailed
			o.Error = fmt.Sprintf("gave up after %d attempts over %s: %s", dl.Attempts,
				o.At.Sub(dl.Event.At).Round(time.Second), o.Error)
		} else {
			o.NextAttempt = o.At.Add(wait)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, finishTimeout)
	defer cancel()
	ok, err := d.s.store.FinishAlertDelivery(rctx, dl.ID, dl.Claim, o)
	log := d.s.log.With("account_id", dl.Event.AccountID, "event", dl.Event.ID, "type", dl.Event.Kind,
		"attempt", dl.Attempts, "webhook_host", hostOf(dl.WebhookURL), "http_status", o.HTTPStatus)
	switch {
	case err != nil:
		log.Error("recording a budget alert delivery", "err", err)
	case !ok:
		log.Warn("budget alert delivery claim expired before its outcome was recorded")
	case o.Status == gpuproxy.AlertDelivered:
		log.Info("budget alert delivered")
	case o.Status == gpuproxy.AlertFailed:
		log.Warn("budget alert delivery failed; giving up", "error", o.Error)
	default:
		log.Info("budget alert delivery failed; will retry", "error", o.Error, "next_attempt", o.NextAttempt)
	}
}

// backoff is the wait after the n-th failed attempt: RetryMin doubled
// n−1 times, at most RetryMax, ±10% so that replicas spread out.
func (d *sender) backoff(n int) time.Duration {
	w := d.s.opts.RetryMin
	for i := 1; i < n && w < d.s.opts.RetryMax; i++ {
		w *= 2
	}
	w = min(w, d.s.opts.RetryMax)
	return time.Duration(float64(w) * (0.9 + 0.2*rand.Float64()))
}

// post makes one attempt: delivered on a 2xx, pending (to retry) on
// another answer or a transport error, failed at once when there is
// nothing to retry (no settings, a refused address).
func (d *sender) post(ctx context.Context, dl gpuproxy.AlertDelivery) gpuproxy.AlertOutcome {
	if dl.WebhookURL == "" {
		return gpuproxy.AlertOutcome{Status: gpuproxy.AlertFailed, Error: "the account has no alert settings any more"}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dl.WebhookURL, bytes.NewReader(dl.Event.Body))
	if err != nil {
		return gpuproxy.AlertOutcome{Status: gpuproxy.AlertFailed, Error: "the webhook URL is not usable"}
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "gpuproxy-alerts/1")
	h.Set(EventHeader, dl.Event.Kind)
	h.Set(DeliveryHeader, dl.Event.ID)
	h.Set(SignatureHeader, Sign(dl.Secret, d.s.opts.Now(), dl.Event.Body))
	resp, err := d.client.Do(req)
	if err != nil {
		var re *netpolicy.RefusedError
		if errors.As(err, &re) {
			return gpuproxy.AlertOutcome{Status: gpuproxy.AlertFailed, Error: fmt.Sprintf(
				"refused: %s resolves to %s, a %s address (see proxy.allow_networks)", re.Host, re.Addr, re.Class)}
		}
		return gpuproxy.AlertOutcome{Status: gpuproxy.AlertPending, Error: transportError(err)}
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return gpuproxy.AlertOutcome{Status: gpuproxy.AlertDelivered, HTTPStatus: resp.StatusCode}
	}
	msg := "HTTP " + resp.Status
	if s := printable(snippet, 200); s != "" {
		msg += ": " + s
	}
	return gpuproxy.AlertOutcome{Status: gpuproxy.AlertPending, HTTPStatus: resp.StatusCode, Error: msg}
}

// transportError describes a failed exchange without its URL, which may
// be a credential (a Slack webhook's path is its token).
func transportError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return err.Error()
}

// printable returns the first n characters of b as one line of text, or
// "" when it is not text.
func printable(b []byte, n int) string {
	if !utf8.Valid(b) {
		return ""
	}
	s := strings.Join(strings.Fields(string(b)), " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n]) + "…"
	}
	return s
}

// hostOf returns a URL's host, for logs: never the whole URL.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Host
	}
	return ""
}
