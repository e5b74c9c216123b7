package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/guardrails"
)

func (s *Server) listAccounts(c echo.Context) error {
	as, err := s.svc.Auth.Accounts(c.Request().Context())
	if err != nil {
		return err
	}
	if as == nil {
		as = []gpuproxy.Account{}
	}
	return c.JSON(http.StatusOK, map[string]any{"accounts": as})
}

func (s *Server) createAccount(c echo.Context) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	a, err := s.svc.Auth.CreateAccount(c.Request().Context(), req.Name)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, a)
}

// windowsBody is the windows list of a limits body.
type windowsBody []struct {
	WindowMinutes int    `json:"window_minutes"`
	Limit         amount `json:"limit"`
}

func (b windowsBody) parse() ([]guardrails.Window, error) {
	ws := make([]guardrails.Window, 0, len(b))
	for i, w := range b {
		lim, err := w.Limit.parse("windows["+itoa(i)+"].limit", true, false)
		if err != nil {
			return nil, err
		}
		ws = append(ws, guardrails.Window{Minutes: w.WindowMinutes, Limit: lim})
	}
	return ws, nil
}

// windowsJSON renders windows as a limits body lists them.
func windowsJSON(ws []guardrails.Window) []map[string]any {
	out := make([]map[string]any, 0, len(ws))
	for _, w := range ws {
		out = append(out, map[string]any{"window_minutes": w.Minutes, "limit": w.Limit})
	}
	return out
}

// setKeyLimits replaces a key's own windows (same body as account limits;
// an empty list removes them).
// confirmAbove is an optional confirm_above field: absent keeps it, null
// removes it, a number sets it.
type confirmAbove struct {
	set bool
	v   *amount
}

func (ca *confirmAbove) UnmarshalJSON(b []byte) error {
	ca.set = true
	if string(b) == "null" {
		return nil
	}
	ca.v = new(amount)
	return ca.v.UnmarshalJSON(b)
}

func (ca confirmAbove) parse() (*gpuproxy.Micros, error) {
	if ca.v == nil {
		return nil, nil
	}
	m, err := ca.v.parse("confirm_above", true, false)
	return &m, err
}

// setKeyLimits replaces a key's own windows (same body as account limits;
// an empty list removes them) and, when given, its confirm_above (null
// removes it).
func (s *Server) setKeyLimits(c echo.Context) error {
	var req struct {
		Windows      *windowsBody `json:"windows"`
		ConfirmAbove confirmAbove `json:"confirm_above"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if req.Windows == nil && !req.ConfirmAbove.set {
		return gpuproxy.Invalid("windows", "give windows (an empty list removes the key's own), confirm_above or both")
	}
	above, err := req.ConfirmAbove.parse()
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	k, err := s.svc.Auth.Key(ctx, c.Param("key_id"))
	if err != nil {
		return err
	}
	if req.Windows != nil {
		ws, err := req.Windows.parse()
		if err != nil {
			return err
		}
		if err := s.svc.Guard.SetKeyLimits(ctx, k.AccountID, k.ID, ws); err != nil {
			return err
		}
	}
	if req.ConfirmAbove.set {
		if err := s.svc.Auth.SetConfirmAbove(ctx, k.AccountID, k.ID, above); err != nil {
			return err
		}
	}
	lims, err := s.svc.Guard.KeyLimits(ctx, k.AccountID)
	if err != nil {
		return err
	}
	out := map[string]any{"id": k.ID, "account": k.AccountName, "windows": windowsJSON(lims[k.ID])}
	if cur, ok, err := s.svc.Auth.ConfirmAbove(ctx, k.ID); err != nil {
		return err
	} else if ok {
		out["confirm_above"] = cur
	}
	return c.JSON(http.StatusOK, out)
}

// setLimits changes an account's windows, on_exceed and lifetime policy:
// only what the body gives changes. Everything is checked before anything
// is written.
func (s *Server) setLimits(c echo.Context) error {
	var req struct {
		Windows    *windowsBody    `json:"windows"`
		OnExceed   string          `json:"on_exceed"`
		TokenPrice json.RawMessage `json:"token_price"`
		policyBody
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	change, err := req.policyBody.change()
	if err != nil {
		return err
	}
	price, setPrice, err := parseTokenPrice(req.TokenPrice)
	if err != nil {
		return err
	}
	if req.Windows == nil && req.OnExceed == "" && change.Empty() && !setPrice {
		return gpuproxy.Invalid("windows", "give windows, on_exceed, token_price, a lifetime policy field "+
			"(default_idle_timeout, default_max_duration, max_idle_timeout, max_max_duration) or several")
	}
	ctx := c.Request().Context()
	a, err := s.svc.Auth.Account(ctx, c.Param("account"))
	if err != nil {
		return err
	}
	var ws []guardrails.Window
	if req.Windows != nil {
		if ws, err = req.Windows.parse(); err != nil {
			return err
		}
	}
	// The policy first: a change that does not apply (a default over
	// its maximum) refuses before the windows are written.
	policy, err := s.svc.Store.UpdateLifetimePolicy(ctx, a.ID, change.Apply)
	if err != nil {
		return err
	}
	if req.Windows != nil || req.OnExceed != "" {
		if err := s.svc.Guard.SetLimits(ctx, a.ID, ws, req.OnExceed); err != nil {
			return err
		}
	}
	if setPrice {
		if err := s.svc.Store.SetAccountTokenPrice(ctx, a.ID, price); err != nil {
			return err
		}
	}
	snap, err := s.svc.Guard.Spending(ctx, a.ID)
	if err != nil {
		return err
	}
	out := limitsJSON{SpendingJSON: apiview.NewSpendingJSON(a.Name, snap), LifetimePolicy: ptr(NewLifetimePolicyJSON(policy))}
	if out.TokenPrice, err = s.tokenPriceJSON(ctx, a.ID); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// TokenPriceJSON is an account's own per-token price: USD per million
// prompt (input) and completion (output) tokens.
type TokenPriceJSON struct {
	InputPer1M  gpuproxy.Micros `json:"input_per_1m"`
	OutputPer1M gpuproxy.Micros `json:"output_per_1m"`
}

func (s *Server) tokenPriceJSON(ctx context.Context, accountID int64) (*TokenPriceJSON, error) {
	p, err := s.svc.Store.AccountTokenPrice(ctx, accountID)
	if err != nil || p == nil {
		return nil, err
	}
	return &TokenPriceJSON{InputPer1M: p.InputPer1M, OutputPer1M: p.OutputPer1M}, nil
}

// parseTokenPrice reads the limits body's token_price: absent (not set),
// null (removed: proxy.token_price applies) or
// {"input_per_1m": USD, "output_per_1m": USD}.
func parseTokenPrice(raw json.RawMessage) (*gpuproxy.TokenPrice, bool, error) {
	if len(raw) == 0 {
		return nil, false, nil
	}
	if string(raw) == "null" {
		return nil, true, nil
	}
	var j struct {
		InputPer1M  *amount `json:"input_per_1m"`
		OutputPer1M *amount `json:"output_per_1m"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return nil, false, gpuproxy.Invalid("token_price", "must be null or {\"input_per_1m\": USD, \"output_per_1m\": USD}")
	}
	var p gpuproxy.TokenPrice
	for _, f := range []struct {
		name string
		in   *amount
		out  *gpuproxy.Micros
	}{{"token_price.input_per_1m", j.InputPer1M, &p.InputPer1M}, {"token_price.output_per_1m", j.OutputPer1M, &p.OutputPer1M}} {
		if f.in == nil {
			return nil, false, gpuproxy.Invalid(f.name, "is required: USD per million tokens (0 for none)")
		}
		v, err := f.in.parse(f.name, true, false)
		if err != nil {
			return nil, false, err
		}
		*f.out = v
	}
	return &p, true, nil
}

// limitsJSON is an account's spending with its lifetime policy: the
// limits answer, and GET /spending for admins.
type limitsJSON struct {
	apiview.SpendingJSON
	LifetimePolicy *LifetimePolicyJSON `json:"lifetime_policy,omitempty"`
	// TokenPrice is the account's own per-token price (absent: none).
	TokenPrice *TokenPriceJSON `json:"token_price,omitempty"`
}

func ptr[T any](v T) *T { return &v }

func (s *Server) addCredit(c echo.Context) error {
	var req struct {
		Account     string `json:"account"`
		Amount      amount `json:"amount"`
		Description string `json:"description"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	amt, err := req.Amount.parse("amount", true, true)
	if err != nil {
		return err
	}
	if req.Account == "" {
		return gpuproxy.Invalid("account", "is required")
	}
	ctx := c.Request().Context()
	a, err := s.svc.Auth.Account(ctx, req.Account)
	if err != nil {
		return err
	}
	key := c.Request().Header.Get("Idempotency-Key")
	e, err := s.svc.Ledger.AddCredit(ctx, a.ID, amt, req.Description, key)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, apiview.NewTransactionJSON(e))
}

func (s *Server) createKey(c echo.Context) error {
	var req struct {
		Name         string       `json:"name"`
		Scopes       []string     `json:"scopes"`
		Preset       string       `json:"preset"`
		Windows      windowsBody  `json:"windows"`
		ConfirmAbove confirmAbove `json:"confirm_above"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	var scopes []gpuproxy.Scope
	switch {
	case req.Preset != "" && len(req.Scopes) > 0:
		return gpuproxy.Invalid("preset", "give scopes or preset, not both")
	case req.Preset != "":
		var ok bool
		if scopes, ok = gpuproxy.Presets[req.Preset]; !ok {
			return gpuproxy.Invalid("preset", "must be assistant, engineer, finance or admin")
		}
	default:
		var err error
		if scopes, err = gpuproxy.ParseScopes(joinComma(req.Scopes)); err != nil {
			return err
		}
	}
	ws, err := req.Windows.parse()
	if err != nil {
		return err
	}
	if len(ws) > 0 {
		if err := guardrails.ValidateWindows(ws); err != nil {
			return err
		}
	}
	above, err := req.ConfirmAbove.parse()
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	plain, k, err := s.svc.Auth.CreateKey(ctx, c.Param("account"), req.Name, scopes)
	if err != nil {
		return err
	}
	var serr error
	if len(ws) > 0 {
		serr = s.svc.Guard.SetKeyLimits(ctx, k.AccountID, k.ID, ws)
	}
	if serr == nil && above != nil {
		serr = s.svc.Auth.SetConfirmAbove(ctx, k.AccountID, k.ID, above)
	}
	if serr != nil {
		// Never leave a key without the limits it was asked with.
		if rerr := s.svc.Auth.RevokeKey(context.WithoutCancel(ctx), k.AccountName, k.ID); rerr != nil {
			s.log.Error("revoking a key whose limits could not be set", "key", k.ID, "err", rerr)
		}
		return serr
	}
	out := map[string]any{"key": plain, "id": k.ID, "account": k.AccountName,
		"name": k.Name, "scopes": k.Scopes, "created_at": k.CreatedAt, "windows": windowsJSON(ws),
		"note": "store this key now: it is shown only once"}
	if above != nil {
		out["confirm_above"] = *above
	}
	return c.JSON(http.StatusCreated, out)
}

// keyJSON is a key as the keys API lists it: with its own windows.
type keyJSON struct {
	gpuproxy.APIKey
	Windows      []map[string]any `json:"windows"`
	ConfirmAbove *gpuproxy.Micros `json:"confirm_above,omitempty"`
}

func (s *Server) listKeys(c echo.Context) error {
	ctx := c.Request().Context()
	a, err := s.svc.Auth.Account(ctx, c.Param("account"))
	if err != nil {
		return err
	}
	ks, err := s.svc.Auth.Keys(ctx, a.Name)
	if err != nil {
		return err
	}
	lims, err := s.svc.Guard.KeyLimits(ctx, a.ID)
	if err != nil {
		return err
	}
	confirms, err := s.svc.Auth.ConfirmThresholds(ctx, a.ID)
	if err != nil {
		return err
	}
	out := make([]keyJSON, 0, len(ks))
	for _, k := range ks {
		kj := keyJSON{APIKey: k, Windows: windowsJSON(lims[k.ID])}
		if v, ok := confirms[k.ID]; ok {
			kj.ConfirmAbove = &v
		}
		out = append(out, kj)
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": out})
}

func (s *Server) revokeKey(c echo.Context) error {
	if err := s.svc.Auth.RevokeKey(c.Request().Context(), c.Param("account"), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func itoa(i int) string { return strconv.Itoa(i) }

func joinComma(ss []string) string { return strings.Join(ss, ",") }
