// Package h1 holds the pieces of HTTP/1.1 connection handling shared by the
// two places gpuproxy speaks the wire format itself: the keep-alive
// connections the server takes over (internal/takeover, which parses
// request heads) and the proxy's upstream client (internal/h1client, which
// parses response heads). It holds no buffer and no goroutine, and parses
// no whole head: each parser keeps its own first line (request line and
// target; status line) and its own framing rules, and hands to net/http
// any head it does not parse. Its invariants are these:
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
//   - Header fields are read (lexed) by the one set of rules both parsers
//     share, never looser than net/http's: a line ends in CRLF, and a bare
//     CR refuses it (NextLine); a field is a token name, a colon right
//     after it (no blank before it, no obs-fold) and a value of visible
//     ASCII, space, tab and obs-text only, trimmed of the blanks around it
//     (HeaderField, IsToken, ValidValue); its name is canonicalized as
//     http.CanonicalHeaderKey does, without an allocation when it is
//     canonical already or a common name (CanonicalKey); a Content-Length
//     is 1 to 18 decimal digits and nothing else, so it never overflows
//     (ContentLength). What these refuse, the parsers hand to net/http;
//     FuzzHeadParse (takeover) and FuzzReadResponse (h1client) prove the
//     parsers, these rules included, against it.
package h1
