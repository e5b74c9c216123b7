package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/guardrails"
)

// spendRefreshTimeout bounds one refresh of a subscribed account's
// spending resource.
const spendRefreshTimeout = 10 * time.Second

// The resources of docs/mcp.md.
const (
	OffersURI    = "gpu://instances"
	SpendingURI  = "spending://current"
	InstancesURI = "instances://mine"
	BillingURI   = "billing://transactions"
)

// resourceScope is the scope needed to see a resource. Unknown URIs need
// admin, so that for everyone else they fail exactly like out-of-scope ones.
func resourceScope(uri string) gpuproxy.Scope {
	switch uri {
	case OffersURI:
		return gpuproxy.ScopeOffersRead
	case SpendingURI:
		return gpuproxy.ScopeSpendingRead
	case InstancesURI:
		return gpuproxy.ScopeInstancesRead
	case BillingURI:
		return gpuproxy.ScopeBillingRead
	}
	return gpuproxy.ScopeAdmin
}

func (s *Server) addResources(srv *sdk.Server) {
	add := func(uri, name, title, desc string, read func(context.Context, gpuproxy.Principal) (any, error)) {
		srv.AddResource(&sdk.Resource{URI: uri, Name: name, Title: title, Description: desc, MIMEType: "application/json"},
			func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
				p, _ := principalOf(ctx, req)
				v, err := read(ctx, p)
				if err != nil {
					return nil, s.resourceError(ctx, uri, err)
				}
				b, err := json.MarshalIndent(v, "", "  ")
				if err != nil {
					return nil, err
				}
				return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{
					{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
			})
	}
	if s.svc.Fleet != nil {
		add(OffersURI, "gpu-offers", "GPU offers", "Current GPU offers across providers, cheapest first (JSON).",
			func(ctx context.Context, _ gpuproxy.Principal) (any, error) {
				return s.offers(ctx, offersInput{Limit: 50})
			})
	}
	add(SpendingURI, "spending", "Your spending windows",
		"Your spending windows: limit, spent, held, committed and remaining per window, and the burn rate (JSON). "+
			"Subscribe to be told when it changes.",
		func(ctx context.Context, p gpuproxy.Principal) (any, error) {
			snap, err := s.svc.Guard.Spending(ctx, p.AccountID)
			if err != nil {
				return nil, err
			}
			s.spend.observe(p.AccountID, snap)
			return apiview.NewSpendingJSON(p.AccountName, snap), nil
		})
	if s.svc.Fleet != nil {
		add(InstancesURI, "my-instances", "Your GPU instances",
			"Your instances with status, endpoint and cost to date (JSON). Subscribe to be told when one is created or destroyed.",
			func(ctx context.Context, p gpuproxy.Principal) (any, error) { return s.mine(ctx, p, "") })
	}
	add(BillingURI, "billing-transactions", "Your recent ledger entries",
		"Your 100 most recent ledger entries with totals (JSON).",
		func(ctx context.Context, p gpuproxy.Principal) (any, error) {
			return s.transactions(ctx, p, billingInput{Limit: 100})
		})
}

// resourceError maps a service error while reading a resource to a
// JSON-RPC error (resources have no isError results).
func (s *Server) resourceError(ctx context.Context, uri string, err error) error {
	code := gpuproxy.ErrorCode(err)
	switch code {
	case gpuproxy.ENOTFOUND:
		return sdk.ResourceNotFoundError(uri)
	case gpuproxy.EINVALID:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: gpuproxy.ErrorMessage(err)}
	case gpuproxy.EINTERNAL:
		s.log.ErrorContext(ctx, "mcp resource read failed", "uri", uri, "err", err)
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
	}
	return &jsonrpc.Error{Code: CodeUnavailable, Message: gpuproxy.ErrorMessage(err) + " " + whatToDo[code]}
}

// subscribe accepts a subscription to a resource the caller may read;
// spending://current and instances://mine then send updates.
func (s *Server) subscribe(ctx context.Context, accountID int64, req *sdk.SubscribeRequest) error {
	p, _ := principalOf(ctx, req)
	uri := req.Params.URI
	if resourceScope(uri) == gpuproxy.ScopeAdmin || !p.Has(resourceScope(uri)) {
		return sdk.ResourceNotFoundError(uri)
	}
	if uri == SpendingURI {
		s.spend.subscribe(ctx, accountID)
	}
	return nil
}

func (s *Server) unsubscribe(accountID int64, req *sdk.UnsubscribeRequest) error {
	if req.Params.URI == SpendingURI {
		s.spend.unsubscribe(accountID)
	}
	return nil
}

// changed is called after an MCP call changed the account's instances:
// subscribers of instances://mine hear of it, and of spending://current
// when the windows moved.
func (s *Server) changed(ctx context.Context, accountID int64) {
	srv := s.serverFor(accountID)
	go func() {
		_ = srv.ResourceUpdated(context.Background(), &sdk.ResourceUpdatedNotificationParams{URI: InstancesURI})
	}()
	s.spend.refresh(ctx, accountID)
}

// hasSessions reports whether the account's server has any open session.
func (s *Server) hasSessions(accountID int64) bool {
	s.mu.Lock()
	srv := s.servers[accountID]
	s.mu.Unlock()
	if srv == nil {
		return false
	}
	for range srv.Sessions() {
		return true
	}
	return false
}

// spendWatch notifies spending://current subscribers when an account's
// windows change: at once after spend-changing MCP calls and on any read
// that sees new numbers, and every Options.SpendPoll for changes made
// elsewhere (metering, REST), polling only accounts with subscribers.
type spendWatch struct {
	s         *Server
	mu        sync.Mutex
	subs      map[int64]int    // account → open subscriptions
	last      map[int64]string // account → fingerprint of the last snapshot seen
	started   bool
	stop      chan struct{}
	closeOnce sync.Once
}

func newSpendWatch(s *Server) *spendWatch {
	return &spendWatch{s: s, subs: map[int64]int{}, last: map[int64]string{}, stop: make(chan struct{})}
}

func (w *spendWatch) subscribe(ctx context.Context, acct int64) {
	w.mu.Lock()
	w.subs[acct]++
	start := !w.started && w.s.opts.SpendPoll > 0
	w.started = w.started || start
	w.mu.Unlock()
	if start {
		go w.run()
	}
	w.refresh(ctx, acct) // the baseline later snapshots are compared with
}

func (w *spendWatch) unsubscribe(acct int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs[acct] > 1 {
		w.subs[acct]--
		return
	}
	delete(w.subs, acct)
	delete(w.last, acct)
}

// refresh re-reads the account's windows if anyone is subscribed.
func (w *spendWatch) refresh(ctx context.Context, acct int64) {
	w.mu.Lock()
	n := w.subs[acct]
	w.mu.Unlock()
	if n == 0 {
		return
	}
	snap, err := w.s.svc.Guard.Spending(context.WithoutCancel(ctx), acct)
	if err != nil {
		return
	}
	w.observe(acct, snap)
}

// observe compares a fresh snapshot with the last one seen and notifies
// the account's subscribers when the numbers moved.
func (w *spendWatch) observe(acct int64, snap guardrails.Snapshot) {
	fp := fingerprint(snap)
	w.mu.Lock()
	if w.subs[acct] == 0 {
		w.mu.Unlock()
		return
	}
	prev, had := w.last[acct]
	w.last[acct] = fp
	w.mu.Unlock()
	if had && prev != fp {
		srv := w.s.serverFor(acct)
		go func() {
			_ = srv.ResourceUpdated(context.Background(), &sdk.ResourceUpdatedNotificationParams{URI: SpendingURI})
		}()
	}
}

func fingerprint(snap guardrails.Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d|%d|%s", snap.Burn, snap.Held, snap.OnExceed)
	for _, u := range snap.Windows {
		fmt.Fprintf(&b, "|%d:%d:%d:%d:%d", u.Minutes, u.Limit, u.Spent, u.Held, u.Committed)
	}
	return b.String()
}

func (w *spendWatch) run() {
	t := time.NewTicker(w.s.opts.SpendPoll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.mu.Lock()
		accts := make([]int64, 0, len(w.subs))
		for a := range w.subs {
			accts = append(accts, a)
		}
		w.mu.Unlock()
		for _, a := range accts {
			if !w.s.hasSessions(a) { // subscribers left without unsubscribing
				w.mu.Lock()
				delete(w.subs, a)
				delete(w.last, a)
				w.mu.Unlock()
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), spendRefreshTimeout)
			w.refresh(ctx, a)
			cancel()
		}
	}
}

func (w *spendWatch) close() { w.closeOnce.Do(func() { close(w.stop) }) }
