// Package takeover serves the keep-alive connections of a hot route
// itself, after net/http has served their first request.
//
// net/http spends, on every request, a goroutine that watches the
// connection for a close while the handler runs, a context tree, several
// deadline changes and the hand-offs between them; for a small proxied
// request that is more CPU than the proxying. So after a request on one of
// the server's takeover routes (the inference proxy) on a plain-HTTP/1.1
// keep-alive connection, the server takes the connection over (Hijack) and
// reads the next requests itself:
//
//   - a request for such a route is parsed by this package's own parser
//     (parseHead), which builds the request http.ReadRequest would and
//     serves only heads net/http's server accepts (Host, header names and
//     values, MaxHeaderBytes, the CR/LF tolerated after a POST: see
//     conn.next and parseHead); FuzzHeadParse proves it against
//     http.ReadRequest and FuzzTakeoverHead against a real http.Server.
//     It is then served on the connection's goroutine through the Route
//     the server's Router returns, so authentication, limits, logs and
//     metrics are the server's; the response is framed here
//     (Content-Length or chunked);
//   - anything else — another route, a head net/http's server would
//     refuse, or a request this loop does not handle (Expect,
//     Transfer-Encoding, Upgrade, HTTP/1.0, a Connection other than
//     keep-alive, a target not in origin form, an empty Host, a head over
//     the buffer, or one parseHead leaves to net/http: obs-fold, bare LF,
//     a repeated Content-Length...) — is handed back to net/http with its
//     bytes unread, and net/http serves (or refuses) it and the
//     connection from then on;
//   - a client that goes away while its request runs still cancels the
//     request: a read on the connection watches for it once the request
//     has run for watchAfter (short requests never pay for it);
//   - http.Server's IdleTimeout, ReadHeaderTimeout, ReadTimeout and
//     WriteTimeout apply as net/http applies them; a request's context
//     carries the values of BaseContext and ConnContext (those of the
//     connection's first request); Shutdown closes idle taken-over
//     connections, and responses it interrupts say Connection: close, but
//     only Conns.Drain waits for busy ones.
//
// Buffers: each Conns owns its pools (read buffers as large as the
// largest head it serves, write buffers) and its Date header cache; nothing is shared
// through package state. A taken-over connection holds its read buffer
// while it waits for a request or reads a body, not while a request
// without a body runs, and its write buffer only while a response is
// being written (given back at each flush, so a long stream holds none
// between its pieces); a closed connection gives both back.
//
// A connection is taken over only when the root handler given to New is
// the http.Server's Handler: the takeover would bypass any handler wrapped
// around it.
//
// The seam with the server is small: the server gives New its root
// handler and a Router that picks, by path, the Route serving a request
// through the server's own middleware; after serving a route's request
// whole, its ServeHTTP calls Conns.TakeOver; at shutdown it calls
// Conns.Drain.
package takeover
