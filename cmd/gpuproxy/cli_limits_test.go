package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestLimitsLifetimePolicyCLI: limits set changes only the lifetime policy
// flags given ("0" turns a default off, "none" unsets), windows alone
// leave the policy, limits show prints it, and mistakes name the flag and
// write nothing.
func TestLimitsLifetimePolicyCLI(t *testing.T) {
	t.Parallel()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": testDatabaseURL(t, k, "lp.db")}
			cli(t, env, "accounts", "create", "acme")
			if out := cli(t, env, "limits", "show", "acme"); !strings.Contains(out, "no lifetime policy") ||
				strings.Contains(out, "lifetime policy for") {
				t.Fatalf("show without a policy:\n%s", out)
			}
			policyLines := func(out string) map[string]string {
				t.Helper()
				_, block, ok := strings.Cut(out, "lifetime policy for acme")
				if !ok {
					t.Fatalf("no policy in:\n%s", out)
				}
				got := map[string]string{}
				for _, l := range strings.Split(block, "\n")[1:] {
					if name, v, ok := strings.Cut(strings.TrimSpace(l), " "); ok {
						got[name] = strings.TrimSpace(v)
					}
				}
				return got
			}
			want := map[string]string{"default_idle_timeout": "30m0s", "default_max_duration": "unset (none)",
				"max_idle_timeout": "2h0m0s", "max_max_duration": "24h0m0s"}
			check := func(what, out string) {
				t.Helper()
				got := policyLines(out)
				for f, v := range want {
					if got[f] != v {
						t.Errorf("%s: %s = %q, want %q\n%s", what, f, got[f], v, out)
					}
				}
			}
			check("set", cli(t, env, "limits", "set", "--account", "acme", "--default-idle-timeout", "30m",
				"--max-idle-timeout", "2h", "--max-max-duration", "24h"))
			check("show", cli(t, env, "limits", "show", "--account", "acme"))
			check("windows only", cli(t, env, "limits", "set", "--account", "acme", "--window", "1h=50"))
			want["default_max_duration"], want["default_idle_timeout"] = "8h0m0s", "0 (off)"
			check("partial", cli(t, env, "limits", "set", "--account", "acme", "--default-max-duration", "8h",
				"--default-idle-timeout", "0"))
			want["default_idle_timeout"] = "unset (the service-wide default)"
			check("none", cli(t, env, "limits", "set", "--account", "acme", "--default-idle-timeout", "none"))

			for _, c := range []struct {
				args []string
				want string
			}{
				{[]string{"--max-idle-timeout", "5s"}, "--max-idle-timeout: must be at least 10s"},
				{[]string{"--default-idle-timeout", "soon"}, "--default-idle-timeout: must be a duration"},
				{[]string{"--default-idle-timeout", "3h"}, "--default-idle-timeout: must be at most the account's max_idle_timeout (2h0m0s)"},
				{[]string{"--max-max-duration", "4h"}, "--max-max-duration: must be at least the account's default_max_duration (8h0m0s)"},
				{[]string{"--window", "1h=7", "--max-max-duration", "-1h"}, "--max-max-duration: must be at least 10s"},
			} {
				args := append([]string{"limits", "set", "--account", "acme"}, c.args...)
				err := run(context.Background(), args, envFunc(env), strings.NewReader(""), io.Discard, io.Discard)
				if err == nil || !strings.HasPrefix(err.Error(), c.want) {
					t.Errorf("%v: %v, want %q", c.args, err, c.want)
				}
			}
			out := cli(t, env, "limits", "show", "acme")
			check("after refusals", out)
			if !strings.Contains(out, "$50.00") || strings.Contains(out, "$7.00") {
				t.Errorf("a refused set wrote its windows:\n%s", out)
			}
			if err := run(context.Background(), []string{"limits", "show", "acme", "--max-idle-timeout", "1h"}, envFunc(env),
				strings.NewReader(""), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "usage: limits show") {
				t.Errorf("limits show with a policy flag: %v", err)
			}
		})
	}
}
