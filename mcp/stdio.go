package mcp

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// ServeStdio serves one MCP session on stdin/stdout as principal p (the
// account of GPUPROXY_API_KEY, authenticated by the caller) until stdin
// ends or ctx is cancelled. Messages are newline-delimited JSON-RPC of at
// most Options.MaxMessage bytes; a longer line, invalid JSON or an invalid
// request is answered with a JSON-RPC error and the session goes on. Only
// MCP messages are written to stdout; logs go to Options.Logger.
func (s *Server) ServeStdio(ctx context.Context, p gpuproxy.Principal, stdin io.Reader, stdout io.Writer) error {
	sid := "stdio-" + rand.Text()[:12]
	c := newLineConn(stdin, stdout, p, int(s.opts.MaxMessage))
	ctx = withSessionID(withPrincipal(ctx, p), sid)
	ss, err := s.serverFor(p.AccountID).Connect(ctx, c, nil)
	if err != nil {
		return err
	}
	s.log.Info("mcp stdio session opened", "mcp_session_id", sid, "account", p.AccountName, "key_id", p.KeyID)
	done := make(chan error, 1)
	go func() { done <- ss.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = ss.Close()
		err = <-done
	}
	s.log.Info("mcp stdio session closed", "mcp_session_id", sid)
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, sdk.ErrConnectionClosed) || ctx.Err() != nil {
		return nil
	}
	return err
}

// lineConn is the stdio sdk.Transport and sdk.Connection: one JSON-RPC
// message per line. It checks each line itself (see decodeMessage) so that
// a bad line gets an error response instead of ending the session, as the
// SDK's own stdio transport would.
type lineConn struct {
	w        io.Writer
	wmu      sync.Mutex
	extra    *sdk.RequestExtra
	incoming chan jsonrpc.Message
	closed   chan struct{}
	once     sync.Once
}

func newLineConn(r io.Reader, w io.Writer, p gpuproxy.Principal, max int) *lineConn {
	c := &lineConn{w: w, extra: &sdk.RequestExtra{TokenInfo: tokenInfo(p)},
		incoming: make(chan jsonrpc.Message), closed: make(chan struct{})}
	go c.readLoop(bufio.NewReaderSize(r, 64<<10), max)
	return c
}

func (c *lineConn) readLoop(br *bufio.Reader, max int) {
	defer close(c.incoming)
	for {
		line, tooLong, err := readLine(br, max)
		switch {
		case tooLong:
			c.writeRaw(encodeRPCError(jsonrpc.ID{}, rpcErr(jsonrpc.CodeInvalidRequest,
				"invalid request: message is larger than the limit of %s", httpapi.HumanBytes(int64(max)))))
		case len(line) > 0 && !isBlank(line):
			msg, id, rerr := decodeMessage(line, true)
			if rerr != nil {
				c.writeRaw(encodeRPCError(id, rerr))
				break
			}
			if req, ok := msg.(*jsonrpc.Request); ok {
				req.Extra = c.extra
			}
			select {
			case c.incoming <- msg:
			case <-c.closed:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// readLine reads one line of at most max bytes (without the newline). A
// longer line is consumed to its end and reported as tooLong.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(frag) > max+2 { // room for "\r\n"
				tooLong, line = true, nil
			} else {
				line = append(line, frag...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, tooLong, err
	}
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

func (c *lineConn) writeRaw(b []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.w.Write(append(b, '\n'))
}

func (c *lineConn) Connect(context.Context) (sdk.Connection, error) { return c, nil }

func (c *lineConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case msg, ok := <-c.incoming:
		if !ok {
			return nil, io.EOF
		}
		return msg, nil
	case <-c.closed:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *lineConn) Write(_ context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.closed:
		return io.EOF
	default:
	}
	_, err = c.w.Write(append(b, '\n'))
	return err
}

func (c *lineConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *lineConn) SessionID() string { return "" }
