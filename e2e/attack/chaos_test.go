package attack

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// chaosMark is when one chaos event struck: from the SIGKILL (or the
// restart's start) to the replica's (or the database's) return.
type chaosMark struct {
	what     string
	from, to time.Time
}

// overlaps reports whether the event was under way at some time in
// [from, to].
func (m chaosMark) overlaps(from, to time.Time) bool { return !m.from.After(to) && !m.to.Before(from) }

// strikeChaos kills a replica (and starts it again) or restarts Postgres,
// and says when.
func strikeChaos(ctx context.Context, t *testing.T, action string, wave int, replicas []*replica, pg *pgCluster,
	dir, bin, cfg string, env []string) (string, chaosMark) {
	m := chaosMark{what: action, from: time.Now()}
	s := strikeChaosAt(ctx, t, action, wave, replicas, pg, dir, bin, cfg, env)
	m.to = time.Now()
	return s, m
}

func strikeChaosAt(ctx context.Context, t *testing.T, action string, wave int, replicas []*replica, pg *pgCluster,
	dir, bin, cfg string, env []string) string {
	switch action {
	case "kill", "kill0":
		r := replicas[len(replicas)-1]
		if action == "kill0" {
			r = replicas[0]
		}
		p := r.proc()
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		killed := time.Now()
		r.mu.Lock()
		r.lastKill = killed
		r.killed = append(r.killed, fmt.Sprintf("%s#%d", r.name(), r.starts))
		r.mu.Unlock()
		// Started again a second later and, like a supervisor would, again
		// while it exits at start-up (the database may be restarting too).
		tries := 0
		for {
			// pace: a supervisor's restart delay.
			time.Sleep(time.Second)
			tries++
			err := r.start(dir, bin, cfg, env)
			if err == nil {
				break
			}
			if time.Since(killed) > 30*time.Second || ctx.Err() != nil {
				t.Errorf("restarting %s after SIGKILL: %v", r.name(), err)
				return fmt.Sprintf("wave %d: SIGKILL %s; restart FAILED: %v", wave, r.name(), err)
			}
		}
		return fmt.Sprintf("wave %d: SIGKILL %s mid-burst, back after %s (%d start(s))", wave, r.name(),
			time.Since(killed).Round(time.Millisecond), tries)
	case "pg":
		took, err := pg.restart()
		if err != nil {
			t.Errorf("%v\n%s", err, pg.logTail(30))
			return fmt.Sprintf("wave %d: pg_ctl restart -m fast FAILED", wave)
		}
		return fmt.Sprintf("wave %d: pg_ctl restart -m fast mid-burst, took %s", wave, took.Round(time.Millisecond))
	}
	return "unknown chaos " + action
}
