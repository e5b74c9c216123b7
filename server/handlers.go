package server

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
)

func (s *Server) health(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]any{"status": "ok", "version": s.opts.Version})
}

// readyTimeout bounds GET /readyz's checks (the database's ping and the
// rest): a store slower than that is not ready.
const readyTimeout = 3 * time.Second

func (s *Server) ready(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), readyTimeout)
	defer cancel()
	checks := map[string]string{}
	ok := true
	if err := s.svc.Store.Ping(ctx); err != nil {
		checks["database"], ok = "unavailable", false
	} else {
		checks["database"] = "ok"
	}
	degraded := false
	for _, rc := range s.svc.ReadyChecks {
		switch err := rc.Check(ctx); {
		case err == nil:
			checks[rc.Name] = "ok"
		case rc.Critical:
			checks[rc.Name], ok = err.Error(), false
		default:
			checks[rc.Name], degraded = err.Error(), true
		}
	}
	status, code := "ready", http.StatusOK
	switch {
	case !ok:
		status, code = "not_ready", http.StatusServiceUnavailable
	case degraded:
		status = "degraded"
	}
	body := map[string]any{"status": status, "checks": checks}
	if s.svc.ReadyDetails != nil {
		if d := s.svc.ReadyDetails(); len(d) > 0 {
			body["details"] = d
		}
	}
	return c.JSON(code, body)
}

// targetAccount is the account a request acts on: the caller's own, or —
// for admins only — the one named by ?account=. A non-admin naming another
// account gets not found, so existence never leaks.
func (s *Server) targetAccount(c echo.Context) (id int64, name string, err error) {
	p := principal(c)
	q := c.QueryParam("account")
	if q == "" || q == p.AccountName {
		return p.AccountID, p.AccountName, nil
	}
	if !p.Has(gpuproxy.ScopeAdmin) {
		return 0, "", gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %q not found", q)
	}
	a, err := s.svc.Auth.Account(c.Request().Context(), q)
	return a.ID, a.Name, err
}

// ownKey is the caller's key when the target account is the caller's own
// (its windows are shown beside the account's), else "".
func (s *Server) ownKey(c echo.Context, accountID int64) string {
	if p := principal(c); p.AccountID == accountID {
		return p.KeyID
	}
	return ""
}

func (s *Server) getSpending(c echo.Context) error {
	id, name, err := s.targetAccount(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	snap, err := s.svc.Guard.KeySpending(ctx, id, s.ownKey(c, id))
	if err != nil {
		return err
	}
	bal, err := s.svc.Ledger.Balance(ctx, id)
	if err != nil {
		return err
	}
	out := limitsJSON{SpendingJSON: apiview.NewSpendingJSON(name, snap).WithBalance(bal)}
	if principal(c).Has(gpuproxy.ScopeAdmin) { // the account's lifetime policy, which admins set
		p, err := s.svc.Store.LifetimePolicy(ctx, id)
		if err != nil {
			return err
		}
		out.LifetimePolicy = ptr(NewLifetimePolicyJSON(p))
		if out.TokenPrice, err = s.tokenPriceJSON(ctx, id); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) checkSpending(c echo.Context) error {
	var req struct {
		EstimatedCost amount `json:"estimated_cost"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	cost, err := req.EstimatedCost.parse("estimated_cost", true, false)
	if err != nil {
		return err
	}
	id, name, err := s.targetAccount(c)
	if err != nil {
		return err
	}
	d, err := s.svc.Guard.KeyCheck(c.Request().Context(), id, s.ownKey(c, id), cost)
	if err != nil {
		return err
	}
	sp := apiview.NewSpendingJSON(name, d.Snapshot)
	for i, u := range d.Windows {
		exceed := !u.Fits(cost)
		sp.Windows[i].WouldExceed = &exceed
	}
	out := map[string]any{"allowed": d.Allowed, "estimated_cost": cost,
		"account": name, "windows": sp.Windows, "burn_rate_per_hour": sp.BurnRatePerHour, "on_exceed": sp.OnExceed}
	if d.Key != nil {
		for i, u := range d.Key.Windows {
			exceed := !u.Fits(cost)
			sp.Key.Windows[i].WouldExceed = &exceed
		}
		out["key"] = sp.Key
	}
	return c.JSON(http.StatusOK, out)
}
