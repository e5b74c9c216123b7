package attack

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// partitionNet is the path one replica takes to Postgres, which the
// partition phase (partition_test.go) cuts and heals.
//
// With network namespaces (mode "netns", as root on Linux): the harness
// adds a namespace of its own and a veth pair, one end in the host
// namespace and one in it, with the two addresses of a private /30 that no
// host interface or route uses. Its forwarder's listening socket is opened
// inside the namespace, on the namespace's address, and relays each
// connection to the harness's own cluster on 127.0.0.1. The cut replica's
// DATABASE_URL names that address, so its packets to Postgres cross the
// veth into the namespace; the cut is two iptables rules inside the
// namespace (its own tables: the host's are never touched) that drop, not
// reject, that port's packets both ways, so the replica's connections see
// silence, never a reset. Healing deletes the rules; cleaning up deletes
// the namespace, which takes the veth pair with it.
//
// Without them (mode "proxy"): the forwarder listens on 127.0.0.1 and the
// cut stops it forwarding: bytes read are held, new connections accepted
// and left waiting, nothing closed.
type partitionNet struct {
	mode             string // "netns" or "proxy"
	why              string // why proxy: the namespace could not be made
	ns, hostIf, nsIf string
	hostAddr, nsAddr string // the /30's two addresses
	port             int    // the forwarder's, where the cut replica connects
	upstream         string // the cluster: 127.0.0.1:port
	ln               net.Listener

	mu     sync.Mutex
	paused chan struct{} // proxy mode: open while cut, closed while forwarding
	isCut  bool
	closed bool
	conns  []net.Conn
	cuts   int
}

// nsPrefix names the harness's namespaces: "gpatk-<pid>".
const nsPrefix = "gpatk-"

// setUpPartitionNet makes the path to the cluster listening on pgPort:
// through a namespace when it can, else through the forwarder on loopback
// (and says why).
func setUpPartitionNet(pgPort int) (*partitionNet, error) {
	p := &partitionNet{upstream: fmt.Sprintf("127.0.0.1:%d", pgPort), paused: make(chan struct{})}
	close(p.paused)
	if err := p.makeNetns(); err != nil {
		p.removeNetns()
		p.mode, p.why = "proxy", err.Error()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p.ln = ln
	} else {
		p.mode = "netns"
	}
	p.port = p.ln.Addr().(*net.TCPAddr).Port
	go p.serve()
	return p, nil
}

// host is where the cut replica connects: host:port.
func (p *partitionNet) host() string {
	if p.mode == "netns" {
		return fmt.Sprintf("%s:%d", p.nsAddr, p.port)
	}
	return fmt.Sprintf("127.0.0.1:%d", p.port)
}

// describe says how the path is made, for the summary.
func (p *partitionNet) describe() string {
	if p.mode == "netns" {
		return fmt.Sprintf("network namespace %s, veth %s (%s/30, host) - %s (%s/30, namespace), forwarder on %s; cut: iptables DROP of tcp port %d both ways inside the namespace",
			p.ns, p.hostIf, p.hostAddr, p.nsIf, p.nsAddr, p.host(), p.port)
	}
	return fmt.Sprintf("TCP forwarder on %s that stops forwarding without closing (no network namespace: %s)", p.host(), p.why)
}

// ipCmd runs a command (ip, iptables) and returns its error with its output.
func ipCmd(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// makeNetns adds the namespace, the veth pair, their addresses, and the
// forwarder's listener inside it.
func (p *partitionNet) makeNetns() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("no %s on PATH", tool)
		}
	}
	removeStaleNetns()
	pid := os.Getpid()
	p.ns = fmt.Sprintf("%s%d", nsPrefix, pid)
	p.hostIf, p.nsIf = fmt.Sprintf("gpa%dh", pid%10_000_000), fmt.Sprintf("gpa%dn", pid%10_000_000)
	net30, err := freeNet30(pid)
	if err != nil {
		return err
	}
	p.hostAddr, p.nsAddr = net30+".1", net30+".2"
	for _, c := range [][]string{
		{"ip", "netns", "add", p.ns},
		{"ip", "link", "add", p.hostIf, "type", "veth", "peer", "name", p.nsIf, "netns", p.ns},
		{"ip", "addr", "add", p.hostAddr + "/30", "dev", p.hostIf},
		{"ip", "link", "set", p.hostIf, "up"},
		{"ip", "-n", p.ns, "addr", "add", p.nsAddr + "/30", "dev", p.nsIf},
		{"ip", "-n", p.ns, "link", "set", p.nsIf, "up"},
		{"ip", "-n", p.ns, "link", "set", "lo", "up"},
		// iptables works inside it (its own tables), or there is no cut.
		{"ip", "netns", "exec", p.ns, "iptables", "-w", "-L", "INPUT", "-n"},
	} {
		if err := ipCmd(c...); err != nil {
			return err
		}
	}
	startNetnsWatchdog(p.ns)
	ln, err := listenInNetns(p.ns, p.nsAddr+":0")
	if err != nil {
		return fmt.Errorf("listening inside %s: %w", p.ns, err)
	}
	p.ln = ln
	p.port = ln.Addr().(*net.TCPAddr).Port
	// The host reaches it through the veth (the address may take a moment).
	if testpoll.Wait(5*time.Second, func() bool {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", fmt.Sprintf("%s:%d", p.nsAddr, p.port), time.Second); err == nil {
			c.Close()
		}
		return err == nil
	}) {
		return nil
	}
	ln.Close()
	return fmt.Errorf("the host cannot reach %s:%d through the veth: %v", p.nsAddr, p.port, err)
}

// freeNet30 picks 10.213.k (k from the pid) whose /24 no host interface
// address and no route names; the /30 is its .0 to .3.
func freeNet30(pid int) (string, error) {
	used := ""
	for _, args := range [][]string{{"ip", "-4", "-o", "addr", "show"}, {"ip", "-4", "route", "show", "table", "all"}} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			return "", fmt.Errorf("%s: %v", strings.Join(args, " "), err)
		}
		used += string(out)
	}
	for i := range 256 {
		n := fmt.Sprintf("10.213.%d", (pid+i)%256)
		if !strings.Contains(used, n+".") {
			return n, nil
		}
	}
	return "", errors.New("no free 10.213.x.0/30")
}

// removeStaleNetns deletes the namespaces of harness runs whose process is
// gone (one killed before its cleanup and its watchdog ran).
func removeStaleNetns() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		pid, ok := strings.CutPrefix(name, nsPrefix)
		if !ok || pid == "" {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue
		}
		_ = ipCmd("ip", "netns", "del", name)
	}
}

// startNetnsWatchdog deletes the namespace once this process is gone, if
// its cleanup did not run (a killed test binary).
func startNetnsWatchdog(ns string) {
	script := fmt.Sprintf("while kill -0 %d 2>/dev/null; do sleep 1; done; ip netns del %s >/dev/null 2>&1", os.Getpid(), ns)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cmd.Start() == nil {
		go func() { _ = cmd.Wait() }()
	}
}

// removeNetns deletes the namespace (and so the veth pair).
func (p *partitionNet) removeNetns() {
	if p.ns != "" {
		_ = ipCmd("ip", "netns", "del", p.ns)
	}
}

// iptables changes the namespace's drop rules: -A to add, -D to delete.
func (p *partitionNet) iptables(op string) error {
	port := fmt.Sprint(p.port)
	for _, rule := range [][]string{
		{"INPUT", "-i", p.nsIf, "-p", "tcp", "--dport", port, "-j", "DROP"},
		{"OUTPUT", "-o", p.nsIf, "-p", "tcp", "--sport", port, "-j", "DROP"},
	} {
		args := append([]string{"ip", "netns", "exec", p.ns, "iptables", "-w", op}, rule...)
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	return nil
}

// cut drops the cut replica's packets to Postgres (netns) or stops
// forwarding them (proxy).
func (p *partitionNet) cut() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts++
	if p.mode == "netns" {
		return p.iptables("-A")
	}
	if !p.isCut {
		p.paused, p.isCut = make(chan struct{}), true
	}
	return nil
}

// heal lets them through again.
func (p *partitionNet) heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == "netns" {
		return p.iptables("-D")
	}
	if p.isCut {
		close(p.paused)
		p.isCut = false
	}
	return nil
}

// gate waits while the forwarder is cut (proxy mode); false once closed.
func (p *partitionNet) gate() bool {
	p.mu.Lock()
	ch := p.paused
	p.mu.Unlock()
	<-ch // closed by heal (or close)
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed
}

// serve relays every connection to the cluster.
func (p *partitionNet) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.relay(c)
	}
}

func (p *partitionNet) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *partitionNet) relay(c net.Conn) {
	if !p.track(c) || !p.gate() {
		c.Close()
		return
	}
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil || !p.track(up) {
		c.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !p.gate() {
					break
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// One side ended (the database restarting, the replica closing):
		// end the other.
		dst.Close()
		src.Close()
	}
	wg.Add(2)
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
}

// close stops the forwarder, ends its connections and deletes the
// namespace.
func (p *partitionNet) close() {
	p.mu.Lock()
	p.closed = true
	if p.isCut { // let the relays waiting at the gate end
		close(p.paused)
		p.isCut = false
	}
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	p.removeNetns()
}
