package server

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/services"
)

// Services over REST: /api/v1/services and /api/v1/services/{id} (an id
// or a name), each a call to services.Manager, whose views are the
// answers as they are.

// Bounds of GET /api/v1/services/{id}/events?limit=.
const (
	defaultServiceEvents = 50
	maxServiceEvents     = 500
)

// POST /api/v1/services: the body is a service definition.
func (s *Server) createService(c echo.Context) error {
	b, err := readBody(c)
	if err != nil {
		return err
	}
	d, err := services.DecodeDefinition(b, nil)
	if err != nil {
		return err
	}
	v, err := s.svc.Services.Create(c.Request().Context(), principal(c), d)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, v)
}

// GET /api/v1/services
func (s *Server) listServices(c echo.Context) error {
	vs, err := s.svc.Services.List(c.Request().Context(), principal(c).AccountID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"services": vs})
}

// serviceJSON is one service as GET /api/v1/services/{id} answers it:
// its view and, on a server with unit economics, what it cost and carried
// since it was created (the summary by service over that period).
type serviceJSON struct {
	services.View
	ToDate *economics.ToDate `json:"to_date,omitempty"`
}

// GET /api/v1/services/{id}
func (s *Server) getService(c echo.Context) error {
	ctx := c.Request().Context()
	acct := principal(c).AccountID
	v, err := s.svc.Services.Get(ctx, acct, c.Param("id"))
	if err != nil {
		return err
	}
	out := serviceJSON{View: v}
	if s.svc.Economics != nil {
		td, err := s.svc.Economics.ServiceToDate(ctx, acct, v.Name, v.CreatedAt)
		if err != nil {
			return err
		}
		out.ToDate = &td
	}
	return c.JSON(http.StatusOK, out)
}

// PATCH /api/v1/services/{id}: the body is the fields to change (a JSON
// merge over the current definition).
func (s *Server) updateService(c echo.Context) error {
	b, err := readBody(c)
	if err != nil {
		return err
	}
	v, err := s.svc.Services.Update(c.Request().Context(), principal(c), c.Param("id"), b)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

// DELETE /api/v1/services/{id}: 202, the replicas drain and are destroyed
// after the answer.
func (s *Server) deleteService(c echo.Context) error {
	v, err := s.svc.Services.Delete(c.Request().Context(), principal(c).AccountID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, v)
}

// GET /api/v1/services/{id}/events[?limit=]
func (s *Server) serviceEvents(c echo.Context) error {
	limit := defaultServiceEvents
	if q := c.QueryParam("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > maxServiceEvents {
			return gpuproxy.Invalid("limit", "must be a whole number between 1 and %d, got %q", maxServiceEvents, q)
		}
		limit = n
	}
	evs, err := s.svc.Services.Events(c.Request().Context(), principal(c).AccountID, c.Param("id"), limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"events": evs})
}

// readBody reads a request's JSON body whole, for a decoder that is not
// bind's: an oversize body is refused as bind refuses it, an empty one
// as no JSON object.
func readBody(c echo.Context) ([]byte, error) {
	b, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return nil, jsonError(err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, gpuproxy.Invalid("body", "a JSON object is required")
	}
	return b, nil
}
