package server

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/internal/httpapi"
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
	offers := make([]httpapi.OfferJSON, 0, len(res.Offers))
	for _, o := range res.Offers {
		offers = append(offers, httpapi.NewOfferJSON(o))
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
		// ConfirmToken is a confirmation_required answer's token, once a
		// person agreed (HTTP 428 names it).
		ConfirmToken string `json:"confirm_token"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	p := principal(c)
	inst, err := s.svc.Fleet.Create(c.Request().Context(), p.AccountID, fleet.CreateRequest{Provider: req.Provider,
		OfferID: req.OfferID, Image: req.Image, Label: req.Label, Hours: req.Hours, Env: req.Env, Ports: req.Ports,
		IdempotencyKey: strings.TrimSpace(c.Request().Header.Get("Idempotency-Key")), KeyID: p.KeyID,
		ConfirmToken: req.ConfirmToken})
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if inst.Status == gpuproxy.Pending {
		status = http.StatusAccepted
	}
	return c.JSON(status, httpapi.NewInstanceJSON(fleet.View{Instance: inst}))
}

func (s *Server) listInstances(c echo.Context) error {
	vs, err := s.svc.Fleet.List(c.Request().Context(), principal(c).AccountID, c.QueryParam("status"))
	if err != nil {
		return err
	}
	out := make([]httpapi.InstanceJSON, 0, len(vs))
	for _, v := range vs {
		out = append(out, httpapi.NewInstanceJSON(v))
	}
	return c.JSON(http.StatusOK, map[string]any{"instances": out})
}

func (s *Server) getInstance(c echo.Context) error {
	v, err := s.svc.Fleet.Get(c.Request().Context(), principal(c).AccountID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, httpapi.NewInstanceJSON(v))
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
	return c.JSON(http.StatusOK, httpapi.NewInstanceJSON(v))
}
