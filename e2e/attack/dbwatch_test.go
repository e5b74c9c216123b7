package attack

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// watchDB calls poll every interval until ctx ends, over one connection to
// the database at url, reconnecting after an error (the database restarts
// mid-attack); each failed connect or poll is counted by failed.
func watchDB(ctx context.Context, url string, every time.Duration, failed func(),
	poll func(context.Context, *pgx.Conn) error) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.Connect(ctx, url)
			if err != nil {
				failed()
				sleepCtx(ctx, every)
				continue
			}
			conn = c
		}
		if err := poll(ctx, conn); err != nil {
			failed()
			conn.Close(context.Background())
			conn = nil
		}
		sleepCtx(ctx, every)
	}
}
