// Package h1client is the proxy's hand-written HTTP/1.1 client: a
// keep-alive pool, the round trip on the caller's goroutine, response body
// framing (a length, chunked, or to the close), a chunked decoder that
// takes its input in pieces of any size, and the relay of a streamed answer
// detached from its handler. net/http's Transport hands each exchange to a
// writer and a reader goroutine of its own; for small inference requests
// those hand-offs cost more CPU than the exchange, so plain-HTTP requests
// whose body is in memory come here, and everything else (https, streamed
// request bodies) stays with http.Transport.
//
// What it accepts and refuses:
//
//   - It sends only what Request holds: an in-memory body with a
//     Content-Length, the caller's header fields written as given (CR and
//     LF replaced, see h1.WriteField; an empty User-Agent is left out), and
//     the request-target with spaces, tabs, CR and LF escaped, so nothing
//     the caller passes can end the request line or start another field.
//   - Response heads are parsed by readResponse (head.go), which parses
//     the common ones itself (HTTP/1.1, a three-digit status, CRLF lines,
//     token names, one Content-Length or one chunked Transfer-Encoding, no
//     Trailer) exactly as http.ReadResponse does and hands any other to
//     http.ReadResponse, so a head net/http refuses is refused here
//     (FuzzReadResponse proves it). Informational answers (1xx)
//     are skipped; 101 Switching Protocols, never asked for, is an error.
//   - Chunked bodies are decoded by chunkDecoder, which accepts what
//     net/http's chunked reader accepts and refuses what it refuses, with
//     the same limits (FuzzChunkDecoder checks it against
//     httputil.NewChunkedReader). A trailer is not parsed: a body that has
//     one is read to its last chunk and its connection closed.
//   - A connection is reused only when its body was read to the end and
//     nothing past it was received; one that closed before any answer is
//     retried once on a new connection when nothing can have been
//     processed (the write failed) or the method is idempotent. A pooled
//     connection idle for over 100 ms is probed (a non-blocking peek)
//     before reuse; one idle past IdleTimeout is closed.
//   - A request asking for a spare (Request.Spare: the proxy's token
//     streams) that leaves no connection to its server idle has one
//     dialed ahead in the background and put in the pool, so that the
//     next stream of a burst finds its connection open rather than
//     waiting on a connect before its first byte (spare.go). At most
//     maxSpareDials (4) such dials per server are in flight.
//
// Buffers: every buffer comes from the Client's Buffers (a value of the
// Client, not the package) and Buffers.Held counts those out. A
// connection holds a head writer only while writing a request and a head
// reader only while reading a response head, or a body that came whole
// with it; the reader goes back when that body ends, or when a streamed
// body has used up what the reader held. A streamed body waits for its
// next bytes through the file descriptor (rawReader) holding no buffer,
// and takes a copy buffer only once bytes are there: an idle or parked
// connection holds none. The caller's copy loop shares the copy buffers
// (Buffers.Get, Put) and calls the body's Ready before taking one.
//
// Deadlines: HeaderTimeout bounds writing the request and reading the
// response head; while waiting for the answer's first byte the caller's
// context is checked every 50 ms (no callback registered per request).
// Once the head is in, a body that came with it needs no I/O; a longer one
// is bounded only by the caller's context (a stream may run long), whose
// cancellation sets a deadline in the past on the connection, which is
// then closed rather than reused. Deadline changes are coalesced
// (h1.Deadline).
//
// Detached streams (Client.Detach): a streamed answer to an HTTP/1.1
// request is relayed on a goroutine of its own after its head went out
// through net/http, the caller's connection hijacked; the relay reads the
// server's connection inside one RawConn.Read, one read and one chunked
// write per piece, and checks a quiet server every StreamIdleCheck. It
// ends at the body's end, at maxBody, when the caller closes its
// connection, at the request context's deadline, or when the server
// shuts down or the Client closes; its done callback runs once, then the
// caller's connection goes back to net/http (Client.Resume, which the
// proxy sets to internal/takeover.Serve) with any bytes of a next request,
// unless the request asked to close it.
//
// Shutdown: Close closes the idle connections, cuts every detached stream,
// cancels the spare dials in flight and waits for them, and makes the pool
// close connections as they come back; a round trip in flight finishes on
// its connection. Evict closes connections idle past
// IdleTimeout (the caller runs it periodically).
package h1client
