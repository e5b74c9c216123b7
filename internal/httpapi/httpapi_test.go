package httpapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want int
	}{
		{gpuproxy.Invalid("f", "bad"), 400},
		{gpuproxy.Errorf(gpuproxy.ENOTFOUND, "x"), 404},
		{gpuproxy.Errorf(gpuproxy.EGONE, "x"), 409},
		{gpuproxy.Errorf(gpuproxy.ELIMIT, "x"), 402},
		{gpuproxy.Errorf(gpuproxy.ERATELIMITED, "x"), 429},
		{gpuproxy.Errorf(gpuproxy.EPROVIDER, "x"), 503},
		{gpuproxy.Errorf(gpuproxy.ETOOLARGE, "x"), 413},
		{&gpuproxy.Error{Code: "upstream_error"}, 500}, // not a shared code
		{errors.New("plain"), 500},
	} {
		if got := httpapi.Status(tc.err); got != tc.want {
			t.Errorf("Status(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	type body struct {
		Error struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	for _, tc := range []struct {
		name, method string
		err          error
		code, msg    string
		details      bool
	}{
		{"invalid", http.MethodGet, gpuproxy.Invalid("to", "must be after from"), gpuproxy.EINVALID, "to: must be after from", true},
		{"internal hidden", http.MethodGet, &gpuproxy.Error{Code: gpuproxy.EINTERNAL, Message: "db password wrong",
			Details: map[string]any{"dsn": "secret"}}, gpuproxy.EINTERNAL, "internal error", false},
		{"head has no body", http.MethodHead, gpuproxy.Invalid("x", "bad"), "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			httpapi.WriteError(w, httptest.NewRequest(tc.method, "/", nil), 418, tc.err)
			if w.Code != 418 || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
				t.Fatalf("status %d, headers %v", w.Code, w.Header())
			}
			if tc.method == http.MethodHead {
				if w.Body.Len() != 0 {
					t.Fatalf("HEAD body: %q", w.Body)
				}
				return
			}
			var b body
			if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
				t.Fatal(err)
			}
			if b.Error.Code != tc.code || b.Error.Message != tc.msg || (b.Error.Details != nil) != tc.details {
				t.Fatalf("body %s", w.Body)
			}
		})
	}
}

func TestPrincipal(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, ok := httpapi.PrincipalFrom(r); ok {
		t.Fatal("principal in a bare request")
	}
	p := gpuproxy.Principal{AccountID: 7, AccountName: "acme"}
	r = r.WithContext(httpapi.WithPrincipal(r.Context(), p))
	if got, ok := httpapi.PrincipalFrom(r); !ok || got.AccountID != 7 || got.AccountName != "acme" {
		t.Fatalf("PrincipalFrom = %+v, %v", got, ok)
	}
}

func TestTimeRange(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		from, to string
		wantFrom time.Time
		wantTo   time.Time
		errField string
	}{
		{"", "", time.Time{}, time.Time{}, ""},
		{"2026-11-25", "2026-11-25T12:00:00+02:00", day, day.Add(10 * time.Hour), ""},
		{"2026-11-25", "", day, time.Time{}, ""},
		{"yesterday", "", time.Time{}, time.Time{}, "from"},
		{"", "2026-13-01", time.Time{}, time.Time{}, "to"},
		{"2026-11-25", "2026-11-25", day, day.Add(24 * time.Hour), ""}, // a date-only to includes that day
		{"2026-11-25", "2026-11-24", time.Time{}, time.Time{}, "to"},   // to must be after from
		{"2026-11-25T12:00:00Z", "2026-11-25T12:00:00Z", time.Time{}, time.Time{}, "to"},
	} {
		q := map[string]string{"from": tc.from, "to": tc.to}
		from, to, err := httpapi.TimeRange(func(k string) string { return q[k] })
		if tc.errField != "" {
			if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || gpuproxy.ErrorDetails(err)["field"] != tc.errField {
				t.Errorf("%q..%q: err %v, want invalid %s", tc.from, tc.to, err, tc.errField)
			}
			continue
		}
		if err != nil || !from.Equal(tc.wantFrom) || !to.Equal(tc.wantTo) || to.Location() != time.UTC {
			t.Errorf("%q..%q = %v, %v, %v", tc.from, tc.to, from, to, err)
		}
	}
}
