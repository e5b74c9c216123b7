// Package h1 holds the pieces of HTTP/1.1 connection handling shared by the
// two places gpuproxy speaks the wire format itself: the keep-alive
// connections the server takes over (internal/takeover) and the proxy's
// upstream client (internal/h1client). It parses nothing and holds no
// buffer and no goroutine; its invariants are these:
//
//   - Deadlines are set per exchange, so they are coalesced (Deadline): a
//     deadline that lies within the slack before the one wanted is kept
//     rather than reset (resetting one is a timer operation, and under
//     load a connection would do it on every request). A Deadline
//     remembers only what was set through it: code that changes the
//     connection's deadline another way calls Forget, and the next Set
//     applies. Past unblocks pending I/O at once (a cancel, a shutdown).
//     A Deadline is used by the connection's one owner goroutine.
//   - Header fields are written with CR and LF in the value replaced by a
//     space (WriteField), so a value can never end the field or start
//     another; names are the caller's, already checked.
//   - BodyAllowed says which final statuses may carry a body (all but 204
//     and 304), as net/http frames them.
package h1
