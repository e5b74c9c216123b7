package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
)

// Budget alerts (package alerts): an admin sets an account's webhook and
// thresholds; an account reads its deliveries.

// alertConfigJSON is an account's alert settings as the API shows them;
// Secret only in the answer that created (or rotated) it.
type alertConfigJSON struct {
	Account    string    `json:"account"`
	WebhookURL string    `json:"webhook_url"`
	Thresholds []float64 `json:"thresholds"`
	Secret     string    `json:"secret,omitempty"`
	Note       string    `json:"note"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// PUT /api/v1/accounts/{account}/alerts
func (s *Server) setAlerts(c echo.Context) error {
	var req struct {
		WebhookURL   string     `json:"webhook_url"`
		Thresholds   *[]float64 `json:"thresholds"`
		RotateSecret bool       `json:"rotate_secret"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	a, err := s.svc.Auth.Account(ctx, c.Param("account"))
	if err != nil {
		return err
	}
	var th []float64 // nil: the defaults
	if req.Thresholds != nil {
		th = append([]float64{}, *req.Thresholds...)
	}
	cfg, secret, err := s.svc.Alerts.Set(ctx, a.ID, req.WebhookURL, th, req.RotateSecret)
	if err != nil {
		return err
	}
	out := alertConfigJSON{Account: a.Name, WebhookURL: cfg.WebhookURL, Secret: secret,
		CreatedAt: cfg.CreatedAt, UpdatedAt: cfg.UpdatedAt, Thresholds: make([]float64, len(cfg.Thresholds))}
	for i, t := range cfg.Thresholds {
		out.Thresholds[i] = t.Fraction()
	}
	out.Note = "the signing secret is unchanged: it is shown only when created; set rotate_secret to replace it"
	if secret != "" {
		out.Note = "store this secret now: it is shown only once. Each POST carries X-Gpuproxy-Signature: " +
			"t=UNIX,v1=HEX, HEX being the HMAC-SHA256 of UNIX + \".\" + the raw body under this secret"
	}
	return c.JSON(http.StatusOK, out)
}

// alertDeliveryJSON is one delivery as the API shows it.
type alertDeliveryJSON struct {
	ID            int64           `json:"id"`
	EventID       string          `json:"event_id"`
	Type          string          `json:"type"`
	WindowMinutes int             `json:"window_minutes,omitempty"`
	Threshold     float64         `json:"threshold,omitempty"`
	InstanceID    string          `json:"instance_id,omitempty"`
	Status        string          `json:"status"`
	Attempts      int             `json:"attempts"`
	LastStatus    int             `json:"last_status,omitempty"`
	LastError     string          `json:"last_error,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	NextAttemptAt time.Time       `json:"next_attempt_at,omitzero"`
	FinishedAt    time.Time       `json:"finished_at,omitzero"`
	Payload       json.RawMessage `json:"payload"`
}

// GET /api/v1/alerts/deliveries[?account=][&status=][&limit=][&before=]
func (s *Server) listAlertDeliveries(c echo.Context) error {
	id, name, err := s.targetAccount(c)
	if err != nil {
		return err
	}
	num := func(field string) (int64, error) {
		v := c.QueryParam(field)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, gpuproxy.Invalid(field, "must be a whole number")
		}
		return n, nil
	}
	limit, err := num("limit")
	if err != nil {
		return err
	}
	before, err := num("before")
	if err != nil {
		return err
	}
	if limit == 0 {
		limit = 50
	}
	if limit < 1 || limit > 500 {
		return gpuproxy.Invalid("limit", "must be between 1 and 500")
	}
	ds, err := s.svc.Alerts.Deliveries(c.Request().Context(), id, c.QueryParam("status"), before, int(limit))
	if err != nil {
		return err
	}
	out := make([]alertDeliveryJSON, len(ds))
	for i, d := range ds {
		out[i] = alertDeliveryJSON{ID: d.ID, EventID: d.Event.ID, Type: d.Event.Kind, WindowMinutes: d.Event.WindowMinutes,
			Threshold: d.Event.Threshold.Fraction(), InstanceID: d.Event.InstanceID, Status: d.Status,
			Attempts: d.Attempts, LastStatus: d.LastStatus, LastError: d.LastError, CreatedAt: d.Event.At,
			NextAttemptAt: d.NextAttemptAt, FinishedAt: d.FinishedAt, Payload: json.RawMessage(d.Event.Body)}
	}
	body := map[string]any{"account": name, "deliveries": out}
	if n := len(ds); n > 0 && int64(n) == limit { // there may be more: the next page is before=next_before
		body["next_before"] = ds[n-1].ID
	}
	return c.JSON(http.StatusOK, body)
}
