package db_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The migration rule (issue 30): from alignedFrom on, a migration that adds
// a feature has the same number and the same name in both dialects —
// migrations/postgres/0022_foo.sql comes with migrations/sqlite/0022_foo.sql
// — so "which migration added X" has one answer on both stores. The older
// migrations were numbered apart (postgres/0017_services is
// sqlite/0014_services) and stay as they are: below alignedFrom each
// dialect is frozen at the highest number it had when the rule began
// (frozenMax), so a new migration cannot slip in under the rule with a
// low number. A change one dialect does not need still takes the number
// in both: the other dialect's file says so in a comment (an empty
// migration is a valid one).
const alignedFrom = 22

// frozenMax is each dialect's highest migration number below alignedFrom
// (postgres/0021_service_blocks and sqlite/0018_service_blocks were the
// last numbered apart).
var frozenMax = map[string]int{"postgres": 21, "sqlite": 18}

// TestMigrationsAlignAcrossDialects reads both dialects' migration
// directories and applies the rule above.
func TestMigrationsAlignAcrossDialects(t *testing.T) {
	t.Parallel()
	lists := map[string][]string{}
	for _, d := range []string{"postgres", "sqlite"} {
		entries, err := os.ReadDir("migrations/" + d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			lists[d] = append(lists[d], e.Name())
		}
	}
	if err := checkMigrationsAlign(lists["postgres"], lists["sqlite"], alignedFrom, frozenMax); err != nil {
		t.Fatal(err)
	}
}

// TestMigrationsAlignCatches shows the check fails on each way the lists
// can drift apart.
func TestMigrationsAlignCatches(t *testing.T) {
	t.Parallel()
	frozen := map[string]int{"postgres": 21, "sqlite": 18}
	old := func(n int) []string {
		var l []string
		for i := 1; i <= n; i++ {
			l = append(l, fmt.Sprintf("%04d_m%d.sql", i, i))
		}
		return l
	}
	pgOld, sqOld := old(21), old(18)
	with := func(l []string, more ...string) []string { return append(slices.Clone(l), more...) }
	for _, tc := range []struct {
		name   string
		pg, sq []string
		want   string // "" = passes; else a fragment of the error
	}{
		{"frozen lists only", pgOld, sqOld, ""},
		{"before the last frozen ones landed", old(20), old(17), ""},
		{"aligned pair", with(pgOld, "0022_quotas.sql"), with(sqOld, "0022_quotas.sql"), ""},
		{"postgres only", with(pgOld, "0022_quotas.sql"), sqOld, "sqlite has no 0022_quotas.sql"},
		{"sqlite only", pgOld, with(sqOld, "0022_quotas.sql"), "postgres has no 0022_quotas.sql"},
		{"names differ", with(pgOld, "0022_quotas.sql"), with(sqOld, "0022_quota.sql"), "has no 0022_"},
		{"numbers differ", with(pgOld, "0022_quotas.sql"), with(sqOld, "0023_quotas.sql"), "has no 0022_quotas.sql"},
		{"sqlite under the rule", pgOld, with(sqOld, "0019_quotas.sql"), "sqlite/0019_quotas.sql"},
		{"postgres under the rule", with(old(20), "0019_quotas.sql"), sqOld, "number 19 used twice"},
		{"a gap below", with(old(19), "0021_quotas.sql"), sqOld, "postgres/0021_quotas.sql"},
		{"two files one number", with(pgOld, "0022_a.sql", "0022_b.sql"), with(sqOld, "0022_a.sql", "0022_b.sql"), "twice"},
		{"no number", with(pgOld, "quotas.sql"), sqOld, "quotas.sql"},
	} {
		err := checkMigrationsAlign(tc.pg, tc.sq, 22, frozen)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want no error", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// checkMigrationsAlign applies the migration rule to the two dialects'
// file names: below from, each dialect's numbers run 1, 2, … without a gap
// up to at most its frozen maximum; from on, each name is in both.
func checkMigrationsAlign(pg, sq []string, from int, frozen map[string]int) error {
	type list struct {
		dialect string
		names   []string
		aligned map[string]bool
	}
	lists := []*list{{dialect: "postgres", names: pg}, {dialect: "sqlite", names: sq}}
	var errs []string
	for _, l := range lists {
		l.aligned = map[string]bool{}
		seen := map[int]string{}
		var below []int
		for _, name := range l.names {
			num, _, ok := strings.Cut(name, "_")
			n, err := strconv.Atoi(num)
			if !ok || err != nil || !strings.HasSuffix(name, ".sql") {
				errs = append(errs, fmt.Sprintf("%s/%s: a migration is named NNNN_name.sql", l.dialect, name))
				continue
			}
			if other, dup := seen[n]; dup {
				errs = append(errs, fmt.Sprintf("%s: number %d used twice (%s, %s)", l.dialect, n, other, name))
				continue
			}
			seen[n] = name
			if n >= from {
				l.aligned[name] = true
			} else {
				below = append(below, n)
			}
		}
		slices.Sort(below)
		for i, n := range below {
			if n != i+1 || n > frozen[l.dialect] {
				errs = append(errs, fmt.Sprintf("%s/%s: new migrations are numbered from %04d on, with the same "+
					"number and name in both dialects (below, %s is frozen at %04d)", l.dialect, seen[n], from,
					l.dialect, frozen[l.dialect]))
				break
			}
		}
	}
	for i, l := range lists {
		other := lists[1-i]
		for _, name := range l.names {
			if l.aligned[name] && !other.aligned[name] {
				errs = append(errs, fmt.Sprintf("%s/%s: %s has no %s (from %04d on both dialects carry each "+
					"migration under the same number and name)", l.dialect, name, other.dialect, name, from))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("migrations drift apart:\n  %s", strings.Join(errs, "\n  "))
	}
	return nil
}
