// Package alerts sends budget alerts: signed webhooks when an account's
// spending approaches its limits, when the kill switch destroys an
// instance, and when a limit refuses a create or a proxy call; and the
// lifetime events of the fleet's lifetime rules: before a rule acts on an
// instance (instance.idle_warning, instance.expiring) and after
// (instance.stopped, instance.destroyed, with the rule), through
// Service.Lifetime, fleet.Options.OnLifetime's hook. Each warning is
// recorded once per rule and acting time and each action once per
// instance, whichever replicas report it. An account without alert
// settings (no webhook) records none of these events, and one that sets a
// webhook later does not receive those of the past.
//
// Each account may set a webhook URL and thresholds, fractions of each
// window's limit (default 50%, 80% and 100%). A window's level is its
// spent + held + committed, the sum admission checks. Every replica runs
// an evaluation loop that periodically reads each alerting account's
// windows and records crossings; a crossing is recorded once whatever
// the number of replicas, because it is decided in the database: the
// replica locks the account's alert settings row, reads the windows, and
// in the same transaction flips the (window, threshold) pair's state and
// inserts the event into an outbox whose (account, crossing) key is
// unique (db.Store.ObserveAlertLevels). A pair re-arms when its level is
// observed below the threshold again, and the next crossing is a new
// event.
//
// A sender on every replica claims due outbox rows (FOR UPDATE SKIP
// LOCKED on Postgres, with a claim token and a deadline), POSTs each
// event's JSON body, and records the outcome: delivered on a 2xx,
// retried with exponential backoff otherwise, given up (failed) after
// Options.RetryFor or at once when the address is refused. Bodies carry a
// human "text" field, so a Slack incoming-webhook URL works as it is, and
// are signed: X-Gpuproxy-Signature: t=UNIX,v1=HEX, HEX being the
// HMAC-SHA256 of "UNIX.BODY" under the account's secret (Sign, Verify).
//
// Webhook addresses obey the same policy as the inference proxy's
// (internal/netpolicy): only public addresses unless allow_networks lists
// them, metadata addresses never; the address that is checked is the
// address that is dialed.
package alerts
