package server

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/httpapi"
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

func (s *Server) setLimits(c echo.Context) error {
	var req struct {
		Windows *[]struct {
			WindowMinutes int    `json:"window_minutes"`
			Limit         amount `json:"limit"`
		} `json:"windows"`
		OnExceed string `json:"on_exceed"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if req.Windows == nil && req.OnExceed == "" {
		return gpuproxy.Invalid("windows", "give windows, on_exceed or both")
	}
	ctx := c.Request().Context()
	a, err := s.svc.Auth.Account(ctx, c.Param("account"))
	if err != nil {
		return err
	}
	var ws []guardrails.Window
	if req.Windows != nil {
		ws = make([]guardrails.Window, 0, len(*req.Windows))
		for i, w := range *req.Windows {
			lim, err := w.Limit.parse("windows["+itoa(i)+"].limit", true, false)
			if err != nil {
				return err
			}
			ws = append(ws, guardrails.Window{Minutes: w.WindowMinutes, Limit: lim})
		}
	}
	if err := s.svc.Guard.SetLimits(ctx, a.ID, ws, req.OnExceed); err != nil {
		return err
	}
	snap, err := s.svc.Guard.Spending(ctx, a.ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, httpapi.NewSpendingJSON(a.Name, snap))
}

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
	return c.JSON(http.StatusCreated, httpapi.NewTransactionJSON(e))
}

func (s *Server) createKey(c echo.Context) error {
	var req struct {
		Name   string   `json:"name"`
		Scopes []string `json:"scopes"`
		Preset string   `json:"preset"`
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
	plain, k, err := s.svc.Auth.CreateKey(c.Request().Context(), c.Param("account"), req.Name, scopes)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, map[string]any{"key": plain, "id": k.ID, "account": k.AccountName,
		"name": k.Name, "scopes": k.Scopes, "created_at": k.CreatedAt,
		"note": "store this key now: it is shown only once"})
}

func (s *Server) listKeys(c echo.Context) error {
	ks, err := s.svc.Auth.Keys(c.Request().Context(), c.Param("account"))
	if err != nil {
		return err
	}
	if ks == nil {
		ks = []gpuproxy.APIKey{}
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": ks})
}

func (s *Server) revokeKey(c echo.Context) error {
	if err := s.svc.Auth.RevokeKey(c.Request().Context(), c.Param("account"), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func itoa(i int) string { return strconv.Itoa(i) }

func joinComma(ss []string) string { return strings.Join(ss, ",") }
