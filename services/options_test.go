package services_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/services"
)

// TestOptionsValidate: a negative duration is an error naming its field
// (never quietly the default), as is a retry maximum under the retry;
// zero takes the default. app.New refuses such options before it starts.
func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		o    services.Options
		want string // "" for valid
	}{
		{services.Options{}, ""},
		{services.Options{Interval: time.Second, BlockedRetry: time.Minute, BlockedRetryMax: time.Hour}, ""},
		{services.Options{BlockedRetry: time.Hour}, ""}, // the default maximum rises to the retry
		{services.Options{Interval: -time.Second}, "services.Options.Interval: must not be negative, got -1s"},
		{services.Options{ProbeInterval: -1}, "services.Options.ProbeInterval"},
		{services.Options{LoadReport: -1}, "services.Options.LoadReport"},
		{services.Options{RouteTTL: -1}, "services.Options.RouteTTL"},
		{services.Options{StartTimeout: -1}, "services.Options.StartTimeout"},
		{services.Options{UnreadyTimeout: -1}, "services.Options.UnreadyTimeout"},
		{services.Options{DrainTimeout: -1}, "services.Options.DrainTimeout"},
		{services.Options{BlockedRetry: -5 * time.Second}, "services.Options.BlockedRetry: must not be negative, got -5s"},
		{services.Options{BlockedRetryMax: -1}, "services.Options.BlockedRetryMax"},
		{services.Options{BlockedRetry: time.Minute, BlockedRetryMax: time.Second},
			"services.Options.BlockedRetryMax: must be at least BlockedRetry (1m0s), got 1s"},
		{services.Options{BlockedRetryMax: time.Second},
			"services.Options.BlockedRetryMax: must be at least BlockedRetry (" + services.DefaultBlockedRetry.String() + "), got 1s"},
	} {
		err := c.o.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.o, err)
		case c.want != "" && (gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || !strings.Contains(gpuproxy.ErrorMessage(err), c.want)):
			t.Errorf("%+v: %v, want an invalid error with %q", c.o, err, c.want)
		}
	}
	st := dbtest.Open(t, dbtest.SQLite)
	_, err := app.New(context.Background(), app.Config{Store: st, Logger: quiet, NoOAuth: true,
		Services: services.Options{BlockedRetry: -time.Second}})
	if err == nil || !strings.Contains(err.Error(), "services.Options.BlockedRetry") {
		t.Fatalf("app.New with a negative services option: %v", err)
	}
}
