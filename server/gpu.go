package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/services"
)

// OfferQueryFrom parses offer filters from query-style values.
func OfferQueryFrom(get func(string) string) (fleet.OfferQuery, error) {
	q := fleet.OfferQuery{Provider: get("provider"), GPUName: get("gpu_name")}
	var err error
	if v := get("min_vram"); v != "" {
		if q.MinVRAM, err = strconv.ParseFloat(v, 64); err != nil {
			return q, gpuproxy.Invalid("min_vram", "must be a number of GB")
		}
	}
	if v := get("max_price"); v != "" {
		if q.MaxPrice, err = gpuproxy.ParseUSD(v); err != nil {
			return q, gpuproxy.InvalidUSD("max_price", err, 0, gpuproxy.MaxMicros, "a number of USD per hour")
		}
		if q.MaxPrice < 0 {
			return q, gpuproxy.Invalid("max_price", "%s", gpuproxy.AmountRange(0, gpuproxy.MaxMicros, false))
		}
	}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"min_gpus", &q.MinGPUs}, {"limit", &q.Limit}} {
		if v := get(f.name); v != "" {
			if *f.dst, err = strconv.Atoi(v); err != nil {
				return q, gpuproxy.Invalid(f.name, "must be an integer")
			}
		}
	}
	return q, nil
}

func (s *Server) listOffers(c echo.Context) error {
	q, err := OfferQueryFrom(c.QueryParam)
	if err != nil {
		return err
	}
	res, err := s.svc.Fleet.Offers(c.Request().Context(), q)
	if err != nil {
		return err
	}
	offers := make([]apiview.OfferJSON, 0, len(res.Offers))
	for _, o := range res.Offers {
		offers = append(offers, apiview.NewOfferJSON(o))
	}
	errs := make([]map[string]string, 0, len(res.Errors))
	for _, e := range res.Errors {
		errs = append(errs, map[string]string{"provider": e.Provider, "message": e.Message})
	}
	return c.JSON(http.StatusOK, map[string]any{"offers": offers, "errors": errs})
}

func (s *Server) createInstance(c echo.Context) error {
	var req struct {
		Provider string            `json:"provider"`
		OfferID  string            `json:"offer_id"`
		Image    string            `json:"image"`
		Label    string            `json:"label"`
		Hours    int               `json:"hours"`
		Env      map[string]string `json:"env"`
		Ports    []int             `json:"ports"`
		// ImageLogin, Onstart and Args pass through to the provider
		// (fleet.CreateRequest); the login is a credential, never shown.
		ImageLogin string   `json:"image_login"`
		Onstart    string   `json:"onstart"`
		Args       []string `json:"args"`
		// ConfirmToken is a confirmation_required answer's token, once a
		// person agreed (HTTP 428 names it).
		ConfirmToken string `json:"confirm_token"`
		// Spec, instead of provider and offer_id, rents the best live
		// offer matching it (fleet.Spec).
		Spec *specJSON `json:"spec"`
		lifetimeJSON
	}
	if err := bindChecked(c, &req, fleet.CreateRules); err != nil {
		return err
	}
	p := principal(c)
	creq := fleet.CreateRequest{Provider: req.Provider,
		OfferID: req.OfferID, Image: req.Image, Label: req.Label, Hours: req.Hours, Env: req.Env, Ports: req.Ports,
		ImageLogin: req.ImageLogin, Onstart: req.Onstart, Args: req.Args,
		IdempotencyKey: strings.TrimSpace(c.Request().Header.Get("Idempotency-Key")), KeyID: p.KeyID,
		ConfirmToken: req.ConfirmToken}
	var err error
	if creq.Lifetime, err = req.lifetimeJSON.request(); err != nil {
		return err
	}
	if req.Spec != nil {
		sp, err := req.Spec.spec()
		if err != nil {
			return err
		}
		creq.Spec = &sp
	}
	inst, err := s.svc.Fleet.Create(c.Request().Context(), p.AccountID, creq)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if inst.Status == gpuproxy.Pending {
		status = http.StatusAccepted
	}
	return c.JSON(status, apiview.NewInstanceJSON(fleet.View{Instance: inst}))
}

func (s *Server) listInstances(c echo.Context) error {
	vs, err := s.svc.Fleet.List(c.Request().Context(), principal(c).AccountID, c.QueryParam("status"))
	if err != nil {
		return err
	}
	out := make([]apiview.InstanceJSON, 0, len(vs))
	for _, v := range vs {
		out = append(out, apiview.NewInstanceJSON(v))
	}
	return c.JSON(http.StatusOK, map[string]any{"instances": out})
}

func (s *Server) getInstance(c echo.Context) error {
	v, err := s.svc.Fleet.Get(c.Request().Context(), principal(c).AccountID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, apiview.NewInstanceJSON(v))
}

func (s *Server) deleteInstance(c echo.Context) error {
	ctx := c.Request().Context()
	acct := principal(c).AccountID
	inst, err := s.svc.Fleet.Destroy(ctx, acct, c.Param("id"))
	if err != nil {
		return err
	}
	v, err := s.svc.Fleet.Get(ctx, acct, inst.ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, apiview.NewInstanceJSON(v))
}

// bindChecked binds the request's JSON body to v after checking its
// fields against rules (the domain's table: type, range, zero), so a
// value out of range or of the wrong type is refused naming the field
// and its range before anything is decoded or admitted.
func bindChecked(c echo.Context, v any, rules gpuproxy.FieldRules) error {
	b, err := readBody(c)
	if err != nil {
		return err
	}
	if err := rules.Check(b); err != nil {
		return err
	}
	c.Request().Body = io.NopCloser(bytes.NewReader(b))
	return bind(c, v)
}

// specJSON is a rent-by-spec request's spec (fleet.Spec): gpu is one name
// or a list; max_price_per_hour is USD per hour for the whole instance.
type specJSON struct {
	GPU             services.StringList `json:"gpu"`
	MinVRAMGB       float64             `json:"min_vram_gb"`
	NumGPUs         int                 `json:"num_gpus"`
	MaxPricePerHour amount              `json:"max_price_per_hour"`
	Providers       services.StringList `json:"providers"`
	MinReliability  float64             `json:"min_reliability"`
	Locations       services.StringList `json:"locations"`
	Billing         string              `json:"billing"`
	Hours           int                 `json:"hours"`
	MaxAttempts     int                 `json:"max_attempts"`
	Market          string              `json:"market"`
	BidMargin       *float64            `json:"bid_margin"`
}

func (j *specJSON) spec() (fleet.Spec, error) {
	price, err := j.MaxPricePerHour.parse("spec.max_price_per_hour", true, true)
	if err != nil {
		return fleet.Spec{}, err
	}
	return fleet.Spec{GPU: j.GPU, MinVRAMGB: j.MinVRAMGB, NumGPUs: j.NumGPUs, MaxPricePerHour: price,
		Providers: j.Providers, MinReliability: j.MinReliability, Locations: j.Locations, Billing: j.Billing,
		Hours: j.Hours, MaxAttempts: j.MaxAttempts, Market: j.Market, BidMargin: j.BidMargin}, nil
}

// lifetimeJSON is a create's or an update's lifetime rules
// (fleet.LifetimeRequest): durations as strings ("30m", "8h"), the cap in
// USD; absent fields are unset.
type lifetimeJSON struct {
	MaxDuration duration `json:"max_duration"`
	IdleTimeout duration `json:"idle_timeout"`
	IdleAction  *string  `json:"idle_action"`
	IdleGrace   duration `json:"idle_grace"`
	SpendCap    amount   `json:"spend_cap"`
}

func (j *lifetimeJSON) request() (fleet.LifetimeRequest, error) {
	var r fleet.LifetimeRequest
	var err error
	for _, f := range []struct {
		name string
		d    *duration
		to   **time.Duration
	}{{"max_duration", &j.MaxDuration, &r.MaxDuration}, {"idle_timeout", &j.IdleTimeout, &r.IdleTimeout},
		{"idle_grace", &j.IdleGrace, &r.IdleGrace}} {
		if *f.to, err = f.d.parse(f.name); err != nil {
			return r, err
		}
	}
	r.IdleAction = j.IdleAction
	if j.SpendCap.set {
		c, err := j.SpendCap.parse("spend_cap", false, false)
		if err != nil {
			return r, err
		}
		r.SpendCap = &c
	}
	return r, nil
}

// duration is an optional JSON duration: a string Go's time package
// parses ("90s", "30m", "8h", "1h30m"), or "0" for none.
type duration struct {
	set bool
	raw json.RawMessage
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *duration) UnmarshalJSON(b []byte) error {
	d.set, d.raw = true, append(json.RawMessage(nil), b...)
	return nil
}

func (d *duration) parse(field string) (*time.Duration, error) {
	if !d.set || string(d.raw) == "null" {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(d.raw, &s); err != nil {
		return nil, gpuproxy.Invalid(field, "must be a duration string such as \"30m\" or \"8h\", got %s", d.raw)
	}
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return nil, gpuproxy.Invalid(field, "must be a duration such as \"30m\" or \"8h\", got %q", s)
	}
	return &v, nil
}

func (s *Server) updateInstance(c echo.Context) error {
	var req lifetimeJSON
	if err := bindChecked(c, &req, fleet.LifetimeRules); err != nil {
		return err
	}
	lr, err := req.request()
	if err != nil {
		return err
	}
	if lr == (fleet.LifetimeRequest{}) {
		return gpuproxy.Invalid("body", "give at least one of max_duration, idle_timeout, idle_action, idle_grace, spend_cap")
	}
	v, err := s.svc.Fleet.UpdateLifetime(c.Request().Context(), principal(c).AccountID, c.Param("id"), lr)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, apiview.NewInstanceJSON(v))
}

func (s *Server) keepAlive(c echo.Context) error {
	v, err := s.svc.Fleet.KeepAlive(c.Request().Context(), principal(c).AccountID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, apiview.NewInstanceJSON(v))
}
