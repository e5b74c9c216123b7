package attack

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// actWatch reads the idle account's instance rows every few hundred
// milliseconds while the attack runs, and keeps what a final read cannot
// show: every rule and acted_us a row carried over time (each must be set
// once, never changed or cleared), and the status it last had.
type actWatch struct {
	mu     sync.Mutex
	byID   map[string]*actHistory
	polls  int
	errors int
}

// actHistory is what the watcher saw of one row.
type actHistory struct {
	status  string
	acts    []actSeen // each distinct (acted_rule, acted_us) it carried, in order
	cleared bool      // acted_rule went back to "" once set
}

// actSeen is one (acted_rule, acted_us) a row carried, and when the
// watcher first saw it.
type actSeen struct {
	rule string
	us   int64
	seen time.Time
}

const actWatchSQL = `SELECT i.id, i.status, i.acted_rule, COALESCE(i.acted_us, 0)
  FROM instances i JOIN accounts a ON a.id = i.account_id WHERE a.name = $1`

// run polls until ctx ends, reconnecting after errors (the database
// restarts mid-attack).
func (w *actWatch) run(ctx context.Context, url, account string, every time.Duration) {
	watchDB(ctx, url, every, w.failed, func(ctx context.Context, c *pgx.Conn) error { return w.poll(ctx, c, account) })
}

func (w *actWatch) poll(ctx context.Context, conn *pgx.Conn, account string) error {
	rows, err := conn.Query(ctx, actWatchSQL, account)
	if err != nil {
		return err
	}
	defer rows.Close()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byID == nil {
		w.byID = map[string]*actHistory{}
	}
	for rows.Next() {
		var id, status, rule string
		var us int64
		if err := rows.Scan(&id, &status, &rule, &us); err != nil {
			return err
		}
		h := w.byID[id]
		if h == nil {
			h = &actHistory{}
			w.byID[id] = h
		}
		h.observe(status, rule, us, now)
	}
	w.polls++
	return rows.Err()
}

// observe records one read of the row.
func (h *actHistory) observe(status, rule string, us int64, now time.Time) {
	h.status = status
	if rule == "" && us == 0 {
		if len(h.acts) > 0 {
			h.cleared = true
		}
		return
	}
	if n := len(h.acts); n == 0 || h.acts[n-1].rule != rule || h.acts[n-1].us != us {
		h.acts = append(h.acts, actSeen{rule: rule, us: us, seen: now})
	}
}

func (w *actWatch) failed() {
	w.mu.Lock()
	w.errors++
	w.mu.Unlock()
}

// status is the row's status at the last read ("" if never read).
func (w *actWatch) status(id string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h := w.byID[id]; h != nil {
		return h.status
	}
	return ""
}

// histories returns a copy of what was seen, by instance id.
func (w *actWatch) histories() map[string]*actHistory {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]*actHistory, len(w.byID))
	for id, h := range w.byID {
		c := *h
		c.acts = append([]actSeen(nil), h.acts...)
		out[id] = &c
	}
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// loggedActs counts, per instance, the "lifetime rule acts" lines of the
// replicas' logs (every process, killed ones too) for the idle rule: one
// per decision carried out.
func loggedActs(dir string) map[string]int {
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "replica*.log"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, `"lifetime rule acts"`) {
				continue
			}
			var e struct {
				Instance string `json:"instance"`
				Rule     string `json:"rule"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Rule == "idle_timeout" {
				out[e.Instance]++
			}
		}
		fh.Close()
	}
	return out
}
