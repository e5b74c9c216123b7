package attack

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestPartitionNetCutsAndHeals: a connection through the partition path
// echoes; once cut, a line sent gets no answer and no error (silence, not
// a reset), nor does a new connection's; healed, both are answered, and
// cleaning up leaves no namespace behind. It runs in whichever mode the
// machine allows (a namespace as root, else the forwarder), and says which.
func TestPartitionNetCutsAndHeals(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write([]byte(sc.Text() + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := setUpPartitionNet(echo.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mode %s: %s", p.mode, p.describe())
	closed := false
	defer func() {
		if !closed {
			p.close()
		}
	}()
	c, err := net.DialTimeout("tcp", p.host(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	say := func(c net.Conn, rd *bufio.Reader, s string, wait time.Duration) (string, error) {
		if _, err := c.Write([]byte(s + "\n")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		return rd.ReadString('\n')
	}
	if got, err := say(c, rd, "one", 2*time.Second); err != nil || got != "one\n" {
		t.Fatalf("before the cut: %q, %v", got, err)
	}
	if err := p.cut(); err != nil {
		t.Fatal(err)
	}
	got, err := say(c, rd, "two", 700*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("cut: want silence (a read timeout), got %q, %v", got, err)
	}
	// A new connection: in a namespace its SYN is dropped (the dial times
	// out); through the forwarder it is accepted and left waiting.
	c2, err := net.DialTimeout("tcp", p.host(), 700*time.Millisecond)
	if err == nil {
		defer c2.Close()
		got, err := say(c2, bufio.NewReader(c2), "new", 700*time.Millisecond)
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("cut: a new connection was answered: %q, %v", got, err)
		}
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("cut: a new connection failed, not timed out (a reset?): %v", err)
	}
	if err := p.heal(); err != nil {
		t.Fatal(err)
	}
	// TCP retransmits what was dropped: the held line arrives, then more.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := rd.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("healed: the line sent while cut: %q, %v", got, err)
	}
	if got, err := say(c, rd, "three", 5*time.Second); err != nil || got != "three\n" {
		t.Fatalf("healed: %q, %v", got, err)
	}
	p.close()
	closed = true
	if p.mode == "netns" {
		if err := ipCmd("ip", "netns", "exec", p.ns, "true"); err == nil {
			t.Fatalf("namespace %s still there after close", p.ns)
		}
	}
}
