package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// credits add --amount follows gpuproxy.ParseUSD and names the flag.
func TestCreditsAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ amount, want string }{
		{"1.1234567", "--amount: must have at most 6 decimal places"},
		{"0.0000001", "--amount: must have at most 6 decimal places"},
		{"0", "--amount: must be greater than 0"},
		{"-5", "--amount: must be greater than 0"},
		{"abc", "--amount: must be a decimal number of US dollars"},
		{" 5", "--amount: must be a decimal number of US dollars"},
		{"+5", "--amount: must be a decimal number of US dollars"},
		{"999999999999", "--amount: must be between"},
	} {
		// The amount is checked before the database is opened.
		err := run(context.Background(), []string{"credits", "add", "--account", "acme", "--amount", tc.amount},
			envFunc(map[string]string{"DATABASE_URL": "nowhere:"}), strings.NewReader(""), io.Discard, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("--amount %q: %v, want %q", tc.amount, err, tc.want)
		}
	}
}

func TestParseWindowFlags(t *testing.T) {
	t.Parallel()
	usd := gpuproxy.Micros(gpuproxy.MicrosPerUSD)
	for _, tc := range []struct {
		specs []string
		want  []guardrails.Window
		err   string // a substring of the error; "" when accepted
	}{
		{[]string{"60m=50", "24h=1000"}, []guardrails.Window{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 1000 * usd}}, ""},
		{[]string{"1440m=1000"}, []guardrails.Window{{Minutes: 1440, Limit: 1000 * usd}}, ""},
		{[]string{"7d=5000"}, []guardrails.Window{{Minutes: 7 * 1440, Limit: 5000 * usd}}, ""},
		{[]string{"60=50"}, nil, "a unit is required: 60m for minutes, 60h for hours or 60d for days"},
		{[]string{"1440=1000"}, nil, "a unit is required"},
		{[]string{"d=5"}, nil, "whole minutes"},
		{[]string{"-7d=5"}, nil, "whole minutes"},
		{[]string{"99999999999d=5"}, nil, "whole minutes"},
		{[]string{" 90m=0.000001 "}, []guardrails.Window{{Minutes: 90, Limit: 1}}, ""},
		{[]string{"1h30m=999999999.999999"}, []guardrails.Window{{Minutes: 90, Limit: gpuproxy.MaxMicros - 1}}, ""},
		{[]string{"60m=0"}, []guardrails.Window{{Minutes: 60}}, ""},
		{[]string{"60m=1e2"}, []guardrails.Window{{Minutes: 60, Limit: 100 * usd}}, ""},
		{[]string{"60m=1.1234567"}, nil, "at most 6 decimal places"},
		{[]string{"60m=1000000000.000001"}, nil, "must be between $0 and $1,000,000,000"},
		{[]string{"1h=1e15"}, nil, "limit: must be between $0 and $1,000,000,000"},
		{[]string{"60m=-1"}, nil, "windows[0].limit"},
		{[]string{"60m= 5"}, nil, "limit"},
		{[]string{"60m=+5"}, nil, "limit"},
		{[]string{"60m=NaN"}, nil, "limit"},
		{[]string{"60m="}, nil, "limit"},
		{[]string{"60m=5=6"}, nil, "limit"},
		{[]string{"60m"}, nil, "want DURATION=USD"},
		{[]string{"=5"}, nil, "whole minutes"},
		{[]string{"+60=5"}, nil, "whole minutes"},
		{[]string{"61s=5"}, nil, "whole minutes"},
		{[]string{"0m=5"}, nil, "windows[0].window_minutes"},
		{[]string{"-60m=5"}, nil, "windows[0].window_minutes"},
		{[]string{"99999999999999999999=5"}, nil, "a unit is required"},
		{[]string{"60m=5", "1h=6"}, nil, "duplicate"},
		{nil, nil, "windows"},
	} {
		got, err := parseWindowFlags(tc.specs)
		if tc.err == "" && (err != nil || !reflect.DeepEqual(got, tc.want)) ||
			tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("parseWindowFlags(%q) = %v, %v; want %v, error %q", tc.specs, got, err, tc.want, tc.err)
		}
	}
}

// Config limits are parsed exactly, from the file and from GPUPROXY_LIMITS
// alike: no float in between.
func TestConfigLimitsExact(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i, tc := range []struct {
		yaml, env string
		want      []guardrails.Window
		err       string
	}{
		{yaml: "limits:\n  - {window: 60m, limit: 999999999.999999}\n  - {window: 1440, limit: 0.000001}\n",
			want: []guardrails.Window{{Minutes: 60, Limit: gpuproxy.MaxMicros - 1}, {Minutes: 1440, Limit: 1}}},
		{yaml: "limits:\n  - {window: 60m, limit: 1e2}\n", want: []guardrails.Window{{Minutes: 60, Limit: 100_000_000}}},
		{yaml: "limits:\n  - {window: 60m, limit: 1.1234567}\n", err: "at most 6 decimal places"},
		{yaml: "limits:\n  - {window: 60m, limit: 0.1000000000000000055511151231257827}\n", err: "at most 6 decimal places"},
		{yaml: "limits:\n  - {window: 60m, limit: \"50\"}\n", err: "limit must be a number"},
		{yaml: "limits:\n  - {window: 60m, limit: [50]}\n", err: "limit must be a number"},
		{yaml: "limits:\n  - {window: 60m, limit: .inf}\n", err: "limit"},
		{env: "60m=999999999.999999, 24h=0.000001",
			want: []guardrails.Window{{Minutes: 60, Limit: gpuproxy.MaxMicros - 1}, {Minutes: 1440, Limit: 1}}},
		{env: "60m=0.1234567", err: "at most 6 decimal places"},
		{yaml: "limits:\n  - {window: 7d, limit: 5}\n", want: []guardrails.Window{{Minutes: 7 * 1440, Limit: 5_000_000}}},
		{env: "60=5", err: "GPUPROXY_LIMITS: window \"60=5\": a unit is required"},
	} {
		path := ""
		if tc.yaml != "" {
			path = filepath.Join(dir, "c"+string(rune('a'+i))+".yaml")
			if err := writeFile(path, tc.yaml); err != nil {
				t.Fatal(err)
			}
		}
		c, err := loadConfig(path, envFunc(map[string]string{"GPUPROXY_LIMITS": tc.env}))
		var ws []guardrails.Window
		if err == nil {
			ws, err = c.windows()
		}
		if tc.err == "" && (err != nil || !reflect.DeepEqual(ws, tc.want)) ||
			tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%d: windows %v, %v; want %v, error %q", i, ws, err, tc.want, tc.err)
		}
	}
}

// TestConfigRequestCostExact: proxy.request_cost is read exactly, in YAML
// and from the environment, and refused past six decimal places or $1000.
func TestConfigRequestCostExact(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i, tc := range []struct {
		yaml, env string
		want      gpuproxy.Micros
		err       string
	}{
		{want: 0},
		{yaml: "proxy:\n  request_cost: 0.000001\n", want: 1},
		{yaml: "proxy:\n  request_cost: 0.01\n", want: 10_000},
		{env: "0.0025", want: 2500},
		{env: "0.0000001", err: "GPUPROXY_PROXY_REQUEST_COST: must have at most 6 decimal places"},
		{yaml: "proxy:\n  request_cost: 1000.5\n", err: "proxy.request_cost: must be between 0 and 1000"},
		{env: "-0.01", err: "GPUPROXY_PROXY_REQUEST_COST: must be between 0 and 1000"},
		{yaml: "proxy:\n  request_cost: \"0.01\"\n", err: "must be a number"},
	} {
		path := ""
		if tc.yaml != "" {
			path = filepath.Join(dir, fmt.Sprintf("rc%d.yaml", i))
			if err := writeFile(path, tc.yaml); err != nil {
				t.Fatal(err)
			}
		}
		c, err := loadConfig(path, envFunc(map[string]string{"GPUPROXY_PROXY_REQUEST_COST": tc.env}))
		var got gpuproxy.Micros
		if err == nil {
			got, err = c.Proxy.requestCost()
		}
		if tc.err == "" && (err != nil || got != tc.want) ||
			tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%d: cost %s, %v; want %s, error %q", i, got, err, tc.want, tc.err)
		}
	}
}
