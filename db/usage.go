package db

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aiserve/gpuproxy"
)

// usageCols are the columns InsertUsage writes, in order.
var usageCols = []string{"account_id", "instance_id", "method", "path", "status", "bytes_in", "bytes_out",
	"latency_us", "ttfb_us", "cost_micros", "at_us", "request_id", "service_id", "model", "prompt_tokens",
	"completion_tokens", "key_id"}

var usageColList = strings.Join(usageCols, ", ")

// appendUsageRow appends a record's column values, negative numbers
// clamped to zero (usage is telemetry: never refused for a bad
// measurement).
// boxes, when not nil, gives the row's repeating strings their boxed form.
func appendUsageRow(args []any, u gpuproxy.Usage, boxes usageBoxes) []any {
	return append(args, u.AccountID, boxes.box(u.InstanceID), boxes.box(u.Method), boxes.box(u.Path), int64(u.Status),
		max(u.BytesIn, 0), max(u.BytesOut, 0), max(u.Latency.Microseconds(), 0), max(u.TTFB.Microseconds(), 0),
		int64(max(u.Cost, 0)), us(u.At), u.RequestID, boxes.box(u.ServiceID), boxes.box(u.Model),
		max(u.PromptTokens, 0), max(u.CompletionTokens, 0), boxes.box(u.KeyID))
}

// usageBoxes keeps, for one insert, the boxed form (an any) of the
// strings its rows repeat (instance, method, path, service, model, key):
// boxing a string for database/sql copies it to the heap, once per row and
// column otherwise.
type usageBoxes map[string]any

// maxUsageBoxes bounds the strings one insert keeps boxed.
const maxUsageBoxes = 256

func (b usageBoxes) box(s string) any {
	if b == nil || s == "" {
		return s
	}
	if v, ok := b[s]; ok {
		return v
	}
	v := any(s)
	if len(b) < maxUsageBoxes {
		b[s] = v
	}
	return v
}

// usageChunk is how many rows one SQLite INSERT carries.
const usageChunk = 64

// usageBatchKeep is how long a written batch's id is remembered (its
// writer gives a batch up after retrying for a minute).
const usageBatchKeep = time.Hour

// InsertUsage appends proxy usage records in one transaction. A batch id,
// when not empty, makes it idempotent: a batch already written (its
// earlier attempt committed, but the answer was lost) is not written
// again. The bulk path is the one place here that differs by dialect:
// Postgres streams the rows with COPY; SQLite takes multi-row INSERTs with
// positional "?" parameters, because its driver looks numbered ones up by
// name, which grows quadratically with the row count of a statement.
func (s *Store) InsertUsage(ctx context.Context, batch string, records []gpuproxy.Usage) error {
	if len(records) == 0 {
		return nil
	}
	var err error
	if s.pg != nil {
		err = s.insertUsagePG(ctx, batch, records)
	} else {
		err = s.insertUsageSQLite(ctx, batch, records)
	}
	if err != nil {
		return fmt.Errorf("inserting proxy usage: %w", err)
	}
	return nil
}

// usageBatchSQL records a batch id, and forgets old ones: it affects no
// row when the batch was written before.
const (
	usageBatchSQL       = "INSERT INTO usage_batches (id, created_us) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"
	usageBatchForgetSQL = "DELETE FROM usage_batches WHERE created_us < $1"
)

func (s *Store) insertUsagePG(ctx context.Context, batch string, records []gpuproxy.Usage) error {
	// One row slice for the whole COPY: pgx encodes a row before it asks
	// for the next.
	row := make([]any, 0, len(usageCols))
	rows := pgx.CopyFromSlice(len(records), func(i int) ([]any, error) {
		row = appendUsageRow(row[:0], records[i], nil)
		return row, nil
	})
	if batch == "" {
		_, err := s.pg.CopyFrom(ctx, pgx.Identifier{"proxy_usage"}, usageCols, rows)
		return translate(err)
	}
	tx, err := s.pg.Begin(ctx)
	if err != nil {
		return translate(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	now := time.Now()
	tag, err := tx.Exec(ctx, usageBatchSQL, batch, us(now))
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return nil // written before
	}
	if _, err := tx.Exec(ctx, usageBatchForgetSQL, us(now.Add(-usageBatchKeep))); err != nil {
		return translate(err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"proxy_usage"}, usageCols, rows); err != nil {
		return translate(err)
	}
	return translate(tx.Commit(ctx))
}

func (s *Store) insertUsageSQLite(ctx context.Context, batch string, records []gpuproxy.Usage) error {
	tx, err := s.sq.BeginTx(ctx, nil)
	if err != nil {
		return translate(err)
	}
	defer func() { _ = tx.Rollback() }()
	if batch != "" {
		now := time.Now()
		res, err := tx.ExecContext(ctx, usageBatchSQL, batch, us(now))
		if err != nil {
			return translate(err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return translate(err) // written before (nil), or the driver failed
		}
		if _, err := tx.ExecContext(ctx, usageBatchForgetSQL, us(now.Add(-usageBatchKeep))); err != nil {
			return translate(err)
		}
	}
	args := make([]any, 0, usageChunk*len(usageCols))
	boxes := make(usageBoxes, 16)
	for len(records) > 0 {
		n := usageChunk
		for n > len(records) {
			n /= 8 // 64, 8 or 1 rows: three statements cover any batch
		}
		chunk := records[:n]
		shared := usageSharedCols(chunk)
		st, shared, err := s.usageStmt(ctx, n, shared)
		if err != nil {
			return err
		}
		args = args[:0]
		for c := range usageCols {
			if shared&(1<<c) != 0 {
				args = append(args, usageValue(&chunk[0], c, boxes))
			}
		}
		for i := range chunk {
			for c := range usageCols {
				if shared&(1<<c) == 0 {
					args = append(args, usageValue(&chunk[i], c, boxes))
				}
			}
		}
		if _, err := tx.StmtContext(ctx, st).ExecContext(ctx, args...); err != nil {
			return translate(err)
		}
		records = records[n:]
	}
	return translate(tx.Commit())
}

// The columns, by their index in usageCols, that a chunk's INSERT binds
// once when every row of the chunk has the same value in them: the
// repeating ones (an instance's traffic has one account, instance,
// method, path, status, service, model and key). Binding a string costs
// the SQLite driver a C allocation and a copy, and database/sql a
// conversion, per row and column otherwise.
const (
	usageColAccount  = 0
	usageColInstance = 1
	usageColMethod   = 2
	usageColPath     = 3
	usageColStatus   = 4
	usageColService  = 12
	usageColModel    = 13
	usageColKey      = 16

	usageShareable = 1<<usageColAccount | 1<<usageColInstance | 1<<usageColMethod | 1<<usageColPath |
		1<<usageColStatus | 1<<usageColService | 1<<usageColModel | 1<<usageColKey
)

// usageSharedCols returns the shareable columns (a bit per column index)
// whose value is the same in every row of chunk.
func usageSharedCols(chunk []gpuproxy.Usage) uint32 {
	if len(chunk) < 2 {
		return 0
	}
	m := uint32(usageShareable)
	f := &chunk[0]
	for i := 1; i < len(chunk) && m != 0; i++ {
		u := &chunk[i]
		if u.AccountID != f.AccountID {
			m &^= 1 << usageColAccount
		}
		if u.InstanceID != f.InstanceID {
			m &^= 1 << usageColInstance
		}
		if u.Method != f.Method {
			m &^= 1 << usageColMethod
		}
		if u.Path != f.Path {
			m &^= 1 << usageColPath
		}
		if u.Status != f.Status {
			m &^= 1 << usageColStatus
		}
		if u.ServiceID != f.ServiceID {
			m &^= 1 << usageColService
		}
		if u.Model != f.Model {
			m &^= 1 << usageColModel
		}
		if u.KeyID != f.KeyID {
			m &^= 1 << usageColKey
		}
	}
	return m
}

// usageValue is column c (an index into usageCols) of u as
// appendUsageRow writes it.
func usageValue(u *gpuproxy.Usage, c int, boxes usageBoxes) any {
	switch c {
	case usageColAccount:
		return u.AccountID
	case usageColInstance:
		return boxes.box(u.InstanceID)
	case usageColMethod:
		return boxes.box(u.Method)
	case usageColPath:
		return boxes.box(u.Path)
	case usageColStatus:
		return int64(u.Status)
	case 5:
		return max(u.BytesIn, 0)
	case 6:
		return max(u.BytesOut, 0)
	case 7:
		return max(u.Latency.Microseconds(), 0)
	case 8:
		return max(u.TTFB.Microseconds(), 0)
	case 9:
		return int64(max(u.Cost, 0))
	case 10:
		return us(u.At)
	case 11:
		return u.RequestID
	case usageColService:
		return boxes.box(u.ServiceID)
	case usageColModel:
		return boxes.box(u.Model)
	case 14:
		return max(u.PromptTokens, 0)
	case 15:
		return max(u.CompletionTokens, 0)
	default: // usageColKey
		return boxes.box(u.KeyID)
	}
}

// usageStmtKey names a prepared usage INSERT: its row count and the
// columns it binds once for every row.
type usageStmtKey struct {
	rows   int
	shared uint32
}

// maxUsageStmts bounds the prepared usage INSERTs a Store keeps: past it,
// a chunk whose shape is new binds every column per row (the statements
// without shared columns are always kept).
const maxUsageStmts = 48

// usageStmt returns the prepared n-row usage INSERT binding the columns
// in shared once, and the shared columns it binds (none when the cache
// is full). It is prepared once per Store; a transaction re-prepares it
// only on a connection that has not seen it yet.
//
// With shared columns it selects them, each one "?" bound once, beside
// the other columns of a VALUES list of the rows: its parameters are the
// shared values, then each row's others, all anonymous (the driver looks
// a named parameter's name up for every parameter of the statement).
func (s *Store) usageStmt(ctx context.Context, n int, shared uint32) (*sql.Stmt, uint32, error) {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	if n < 2 {
		shared = 0
	}
	k := usageStmtKey{n, shared}
	if st := s.usageStmts[k]; st != nil {
		return st, shared, nil
	}
	if shared != 0 && len(s.usageStmts) >= maxUsageStmts {
		shared = 0
		k = usageStmtKey{n, 0}
		if st := s.usageStmts[k]; st != nil {
			return st, shared, nil
		}
	}
	var cols, perRow []string
	for c, name := range usageCols {
		if shared&(1<<c) != 0 {
			cols = append(cols, name)
		} else {
			perRow = append(perRow, name)
		}
	}
	row := "(" + strings.Repeat("?, ", len(perRow)-1) + "?)"
	values := "VALUES " + strings.Repeat(row+", ", n-1) + row
	q := "INSERT INTO proxy_usage (" + usageColList + ") " + values
	if len(cols) > 0 {
		sel := strings.Repeat("?, ", len(cols))
		for i := range perRow {
			sel += "column" + strconv.Itoa(i+1)
			if i < len(perRow)-1 {
				sel += ", "
			}
		}
		q = "INSERT INTO proxy_usage (" + strings.Join(append(cols, perRow...), ", ") + ") SELECT " + sel +
			" FROM (" + values + ")"
	}
	st, err := s.sq.PrepareContext(ctx, q)
	if err != nil {
		return nil, 0, translate(err)
	}
	if s.usageStmts == nil {
		s.usageStmts = map[usageStmtKey]*sql.Stmt{}
	}
	s.usageStmts[k] = st
	return st, shared, nil
}

// usageWhere builds the WHERE clause of a usage filter (without cursor).
func usageWhere(f gpuproxy.UsageFilter) (string, []any) {
	conds := []string{"account_id = $1"}
	args := []any{f.AccountID}
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if !f.From.IsZero() {
		add("at_us >= $%d", us(f.From))
	}
	if !f.To.IsZero() {
		add("at_us < $%d", us(f.To))
	}
	if f.InstanceID != "" {
		add("instance_id = $%d", f.InstanceID)
	}
	return strings.Join(conds, " AND "), args
}

// ListUsage returns one page of the account's usage records, newest first
// (by id), with ids below f.BeforeID when set.
func (s *Store) ListUsage(ctx context.Context, f gpuproxy.UsageFilter) ([]gpuproxy.Usage, error) {
	w, args := usageWhere(f)
	if f.BeforeID > 0 {
		args = append(args, f.BeforeID)
		w += fmt.Sprintf(" AND id < $%d", len(args))
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	r, err := s.pool().query(ctx, fmt.Sprintf("SELECT id, %s FROM proxy_usage WHERE %s ORDER BY id DESC LIMIT %d",
		usageColList, w, limit), args...)
	out, err := scanAll(r, err, func(r rows) (gpuproxy.Usage, error) {
		var u gpuproxy.Usage
		var status, lat, ttfb, cost, at int64
		err := r.Scan(&u.ID, &u.AccountID, &u.InstanceID, &u.Method, &u.Path, &status, &u.BytesIn, &u.BytesOut,
			&lat, &ttfb, &cost, &at, &u.RequestID, &u.ServiceID, &u.Model, &u.PromptTokens, &u.CompletionTokens,
			&u.KeyID)
		u.Status, u.Latency, u.TTFB = int(status), time.Duration(lat)*time.Microsecond, time.Duration(ttfb)*time.Microsecond
		u.Cost, u.At = gpuproxy.Micros(cost), fromUS(at)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing proxy usage: %w", err)
	}
	return out, nil
}

// UsageTotals sums every usage record f matches (ignoring paging).
func (s *Store) UsageTotals(ctx context.Context, f gpuproxy.UsageFilter) (gpuproxy.UsageTotals, error) {
	w, args := usageWhere(f)
	var t gpuproxy.UsageTotals
	var lat, ttfb, cost int64
	err := s.pool().queryRow(ctx, `SELECT count(*),
		COALESCE(sum(CASE WHEN status >= 500 OR status = 0 THEN 1 ELSE 0 END), 0),
		COALESCE(sum(bytes_in), 0), COALESCE(sum(bytes_out), 0), COALESCE(sum(latency_us), 0),
		COALESCE(sum(ttfb_us), 0), COALESCE(sum(cost_micros), 0)
		FROM proxy_usage WHERE `+w, args...).Scan(&t.Requests, &t.Errors, &t.BytesIn, &t.BytesOut, &lat, &ttfb, &cost)
	if err != nil {
		return t, fmt.Errorf("totalling proxy usage: %w", translate(err))
	}
	t.Latency, t.TTFB, t.Cost = time.Duration(lat)*time.Microsecond, time.Duration(ttfb)*time.Microsecond, gpuproxy.Micros(cost)
	return t, nil
}
