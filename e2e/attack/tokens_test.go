package attack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Per-token prices (issue 23, item 3): the account atk-tok has a price
// of its own per million prompt and completion tokens (PUT
// /api/v1/accounts/{account}/limits with token_price) and a tight
// 60-minute window, raised before every wave. Each wave's burst sends
// chat completions, plain and streamed, every one with max_tokens, to its
// io.net instance through the instance proxy
// (/api/v1/proxy/{id}/v1/chat/completions) of every gpuproxy replica in
// turn, through the SIGKILLs and the database restart. Each is admitted
// for its most expensive outcome (the per-request cost, its prompt at
// body bytes / 3 rounded up, its output at max_tokens) and settled at the
// tokens its answer counted. The burst asks for far more than the window
// holds, so it runs into it; no sample and no final read may show the
// window passed, every record must cost the per-request cost plus its
// counted tokens at the price, and the ledger must hold exactly what the
// records say (tokencheck_test.go).
//
// Each replica process sends with a key of its own ("attack tokens
// replica2#1"; a restarted replica takes the next), with a window of its
// own far above the account's, so that it never binds: every lease, and
// every ledger row of it, names the key, and so the process. The ledger
// then splits by process, and what a SIGKILLed process charged is
// bounded on its own while every other process's charges must equal its
// records to the micro-dollar.
//
// The account owns a running vast.ai instance (time-billed: its meter
// runs, and its price for the admission horizon is committed), the case
// issue 29 found: a proxy charge spends the money a running instance was
// promised, so leases and token admissions must count the committed
// hour like creates do. The window is that hour plus the room of the
// bursts, and what every sample must show is spent + held + committed ≤
// limit (allowing only the metered burn, as for every window: the
// committed hour is consumed as it is metered). A build that admits
// proxy costs on spent + held alone fills the committed hour too.
//
// Why the instance proxy and the account's own price rather than a
// service with a price of its own: the account's price prices that
// account's calls only, so every other phase keeps its $0.01 a call
// (proxy.token_price would reprice the proxy phase, the lifetime traffic
// and the service's chat); and no second service rents a GPU by spec
// from the market the by-spec herd and the services phase contest (the
// services phase sizes its key's window from what is listed). A
// service's own price is the same admission and settlement code
// (proxy.reserve, settlePriced) behind another router; its in-process
// proof over four replicas is services/tokens_test.go.

// tokAccount owns the token-priced instance.
const tokAccount = "atk-tok"

// The phase's prices and windows.
const (
	// tokInPer1M and tokOutPer1M are the account's price, USD per million
	// prompt and completion tokens: $0.001 and $0.004 a token, so a
	// request's tokens cost some ten times its $0.01.
	tokInPer1M  = 1000
	tokOutPer1M = 4000
	// tokSetupLimit is the account's 60-minute window (USD) while its
	// instance is created; then it becomes what it has spent (the
	// instance's metered minutes) plus the instance's committed hour plus
	// tokRoom, and tokRaise more before every later wave: a burst asks for
	// several times that.
	tokSetupLimit = 5.0
	tokRoom       = 1.2
	tokRaise      = 1.0
	// tokPromptWords is the user message's words: the simulated model
	// counts a prompt's words as its tokens, and answers with five words
	// and the first 80 characters of it (17 words here), cut at
	// max_tokens.
	tokPromptWords = 12
	// streamUsageBytes is what the proxy adds to a streamed request that
	// does not ask for its usage (proxy.stream_usage add, the default),
	// before it is priced: `,"stream_options":{"include_usage":true}`.
	streamUsageBytes = 40
	// promptBytesPerToken is the proxy's prompt estimate's divisor.
	promptBytesPerToken = 3
	// tokTries is how many times a request is sent while it fails.
	tokTries = 4
	// tokKeyLimit is each process's key's own 60-minute window (USD): far
	// above the account's, never the one that binds.
	tokKeyLimit = 1000.0
)

// tokMaxTokens are the max_tokens the requests take in turn: the first
// three cut the answer (its tokens are the admitted ones), the last does
// not (the admission's unused part goes back).
var tokMaxTokens = []int{4, 8, 16, 32}

// tokenPrice is a price per million tokens, in micro-dollars.
type tokenPrice struct{ in, out int64 }

// cost is what prompt and completion tokens cost at p, each part rounded
// up to the micro-dollar (gpuproxy.TokenPrice.Cost).
func (p tokenPrice) cost(prompt, completion int64) int64 {
	part := func(price, n int64) int64 {
		if price <= 0 || n <= 0 {
			return 0
		}
		return (price*n + 999_999) / 1_000_000
	}
	return part(p.in, prompt) + part(p.out, completion)
}

// tokRefusal is what a 402's error says.
type tokRefusal struct {
	code, scope, keyID, message string
	minutes                     int
	cost, remaining             int64 // the reserved cost it names, and the window's remaining room
	hasCost                     bool
}

// tokReq is one token-priced request as its client saw it.
type tokReq struct {
	n, try      int // request n's try number try
	wave        int
	keyID       string // the key it was sent with: its process's
	rid         string // its X-Request-Id, which the usage record keeps
	stream      bool
	maxTokens   int
	bodyLen     int   // bytes sent
	admitted    int64 // what the proxy admits it for: per-request cost + prompt estimate + max_tokens
	replica     int
	proc        string // the replica process it was sent to: "replica2#1"
	changed     bool   // the replica was restarted while it ran
	sent, done  time.Time
	status      int // 0: transport error
	why         string
	ok          bool // 200 and a whole answer (a stream's [DONE])
	prompt      int64
	completion  int64 // tokens the answer delivered: usage (plain), content chunks (stream)
	usageInSSE  bool  // a stream carried a usage chunk the client did not ask for
	probe       bool  // the partition phase's, sent to the cut replica only
	refusal     *tokRefusal
	promptWords int64
}

// tokKey is one API key of the phase.
type tokKey struct{ name, secret, id string }

// tokenLoad is the token-priced phase of the run.
type tokenLoad struct {
	price        tokenPrice
	adminKey     string
	creator      tokKey             // created the instance; sends nothing
	keys         map[string]*tokKey // by the process that sends with it: "replica2#1"
	inst         instance
	prior        int64 // the account's spend before the bursts (its instance's metered minutes)
	commit       int64 // the running instance's committed hour (price × horizon)
	room0, raise int64

	mu   sync.Mutex
	reqs []tokReq
}

// limitAt is the account's 60-minute window in wave w.
func (tl *tokenLoad) limitAt(wave int) int64 {
	return tl.prior + tl.commit + tl.room0 + int64(wave)*tl.raise
}

// startTokens sets up the account (through the CLI), gives it its price
// through the admin API (a build without account prices refuses
// token_price as an unknown field: the phase is left out, nil and why),
// rents its vast.ai instance (the first of offers that is still there)
// and, once it runs, sets its window to its spend plus the committed hour
// plus tokRoom. Each replica process gets a key: procs lists them, the first
// process of every replica and those its restarts may start.
func startTokens(ctx context.Context, t *testing.T, a *api, run func(args ...string) string, dbURL string, offers []offer,
	procs []string) (*tokenLoad, string, error) {
	tl := &tokenLoad{price: tokenPrice{tokInPer1M * 1_000_000, tokOutPer1M * 1_000_000},
		room0: micros(tokRoom), raise: micros(tokRaise), keys: map[string]*tokKey{}, creator: tokKey{name: "attack tokens"}}
	run("accounts", "create", tokAccount)
	tl.adminKey = lastLine(run("keys", "create", "--account", tokAccount, "--preset", "admin", "--name", "attack admin"))
	tl.creator.secret = lastLine(run("keys", "create", "--account", tokAccount, "--preset", "assistant", "--name", tl.creator.name))
	for _, p := range procs {
		k := &tokKey{name: "attack tokens " + p}
		k.secret = lastLine(run("keys", "create", "--account", tokAccount, "--preset", "assistant", "--name", k.name,
			"--window", keyWindow{60, tokKeyLimit}.String()))
		tl.keys[p] = k
	}
	run("limits", "set", "--account", tokAccount, "--window", keyWindow{60, tokSetupLimit}.String())
	run("credits", "add", "--account", tokAccount, "--amount", "1000")
	body := map[string]any{"token_price": map[string]any{"input_per_1m": tokInPer1M, "output_per_1m": tokOutPer1M}}
	var r reply
	for try := range 6 {
		r = a.do(ctx, try, http.MethodPut, "/api/v1/accounts/"+tokAccount+"/limits", tl.adminKey, body, nil)
		if !r.retryable() {
			break
		}
		// pace: a client's retry backoff.
		time.Sleep(300 * time.Millisecond)
	}
	var got struct {
		TokenPrice *struct {
			In  json.Number `json:"input_per_1m"`
			Out json.Number `json:"output_per_1m"`
		} `json:"token_price"`
	}
	switch {
	case r.err == nil && r.status == http.StatusOK && json.Unmarshal(r.body, &got) == nil && got.TokenPrice != nil:
		if in, out := parseMicros(string(got.TokenPrice.In)), parseMicros(string(got.TokenPrice.Out)); in != tl.price.in || out != tl.price.out {
			return nil, "", fmt.Errorf("account %s's token price set to $%d/$%d per 1M, the answer says %s/%s", tokAccount,
				tokInPer1M, tokOutPer1M, got.TokenPrice.In, got.TokenPrice.Out)
		}
	case r.err == nil && r.status == http.StatusBadRequest && bytes.Contains(r.body, []byte("unknown field")) &&
		bytes.Contains(r.body, []byte("token_price")):
		return nil, fmt.Sprintf("PUT limits with token_price: %s", r), nil
	default:
		return nil, "", fmt.Errorf("setting %s's token price: %s", tokAccount, r)
	}
	var err error
	if tl.inst, err = rentRunning(ctx, a, tl.creator.secret, offers, 6); err != nil {
		return nil, "", fmt.Errorf("renting %s's instance: %w", tokAccount, err)
	}
	st, err := readState(ctx, dbURL)
	if err != nil {
		return nil, "", err
	}
	for _, m := range st.meters {
		if m.instanceID == tl.inst.ID && !m.stopped {
			tl.commit += m.price * int64(horizon/time.Microsecond) / hourUS
		}
	}
	if tl.commit == 0 {
		return nil, "", fmt.Errorf("%s's instance %s runs without an open meter: nothing is committed", tokAccount, tl.inst.ID)
	}
	for _, k := range append([]*tokKey{&tl.creator}, tl.sortedKeys()...) {
		row := st.keyNamed(tokAccount, k.name)
		if row == nil {
			return nil, "", fmt.Errorf("key %q of %s not in api_keys after keys create", k.name, tokAccount)
		}
		k.id = row.id
	}
	tl.prior = st.accountSpend(tokAccount)
	if err := tl.setWindow(ctx, a, 0); err != nil {
		return nil, "", err
	}
	return tl, "", nil
}

// sortedKeys are the processes' keys by name.
func (tl *tokenLoad) sortedKeys() []*tokKey {
	out := make([]*tokKey, 0, len(tl.keys))
	for _, k := range tl.keys {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// keyNames are the processes' keys: id → the process ("replica2#1").
func (tl *tokenLoad) keyNames() map[string]string {
	out := map[string]string{}
	for p, k := range tl.keys {
		out[k.id] = p
	}
	return out
}

// keyFor is the key process gen of replica r sends with: its own, or (a
// start the set-up did not foresee) the replica's latest one.
func (tl *tokenLoad) keyFor(r *replica, gen int) *tokKey {
	for g := gen; g > 0; g-- {
		if k := tl.keys[fmt.Sprintf("%s#%d", r.name(), g)]; k != nil {
			return k
		}
	}
	return tl.sortedKeys()[0]
}

// tokProcs are the replica processes a run of size sz may start: each
// replica's first, and two more for every SIGKILL it takes (a restart
// may fail while the database is down, and count a start).
func tokProcs(sz size) []string {
	starts := make([]int, sz.replicas)
	for i := range starts {
		starts[i] = 1
	}
	for _, c := range sz.chaos {
		switch c {
		case "kill":
			starts[sz.replicas-1] += 2
		case "kill0":
			starts[0] += 2
		}
	}
	var out []string
	for i, n := range starts {
		for g := 1; g <= n; g++ {
			out = append(out, fmt.Sprintf("replica%d#%d", i, g))
		}
	}
	return out
}

// setWindow sets the account's 60-minute window to limitAt(wave).
func (tl *tokenLoad) setWindow(ctx context.Context, a *api, wave int) error {
	w := keyWindow{60, float64(tl.limitAt(wave)) / 1e6}
	if r := putLimits(ctx, a, wave, "/api/v1/accounts/"+tokAccount+"/limits", tl.adminKey, []keyWindow{w}); r.err != nil ||
		r.status != http.StatusOK {
		return fmt.Errorf("setting %s's window to %v: %s", tokAccount, w, r)
	}
	return nil
}

// start sends the wave's burst of n requests once gate opens, request i
// to replica i, half of them streamed, in wg. A request that failed (a
// transport error, a 5xx, a cut stream: a replica killed, the database
// restarting) is sent again to the next replica, as a careful client
// would, so that a chaos wave's burst still contests the window once the
// replica or the database is back; each try is a request of its own (its
// own X-Request-Id). A request counts in prog once it has its last
// answer.
func (tl *tokenLoad) start(ctx context.Context, a *api, wave, n int, gate <-chan struct{}, wg *sync.WaitGroup, prog *progress) {
	for i := range n {
		k := wave*n + i
		wg.Go(func() {
			<-gate
			for try := 0; ; try++ {
				r := tl.call(ctx, a, k, try, wave)
				tl.mu.Lock()
				tl.reqs = append(tl.reqs, r)
				tl.mu.Unlock()
				if r.ok || r.status == http.StatusPaymentRequired || r.status/100 == 4 || try == tokTries-1 || ctx.Err() != nil {
					break
				}
				// pace: a client's retry backoff.
				time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
			}
			prog.done.Add(1)
		})
	}
}

// requests returns a copy of the requests made.
func (tl *tokenLoad) requests() []tokReq {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]tokReq(nil), tl.reqs...)
}

// tokBody is a request's body, its fields in a fixed order so its length
// (which the admission prices) is known.
type tokBody struct {
	Model     string       `json:"model"`
	MaxTokens int          `json:"max_tokens"`
	Messages  []tokMessage `json:"messages"`
	Stream    bool         `json:"stream,omitempty"`
}

type tokMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// admittedCost is what the proxy admits a request of bodyLen bytes for:
// the per-request cost, its prompt estimated at bytes / 3 rounded up (a
// stream's body with what the proxy adds to ask for its usage) and its
// output at max_tokens.
func admittedCost(p tokenPrice, bodyLen int, stream bool, maxTokens int) int64 {
	n := int64(bodyLen)
	if stream {
		n += streamUsageBytes
	}
	return int64(requestCost*1e6) + p.cost((n+promptBytesPerToken-1)/promptBytesPerToken, int64(maxTokens))
}

// call sends try number try of request n to replica n + try: a chat
// completion with max_tokens, streamed when n is odd, with its own
// X-Request-Id, and reads the answer to its end.
func (tl *tokenLoad) call(ctx context.Context, a *api, n, try, wave int) (q tokReq) {
	return tl.callOn(ctx, a, a.replicas[(n+try)%len(a.replicas)], n, try, wave)
}

// callOn is call, sent to replica rp.
func (tl *tokenLoad) callOn(ctx context.Context, a *api, rp *replica, n, try, wave int) (q tokReq) {
	q = tokReq{n: n, try: try, wave: wave, rid: fmt.Sprintf("atk-tok-%d.%d", n, try), stream: n%2 == 1,
		maxTokens: tokMaxTokens[(n/2)%len(tokMaxTokens)], replica: rp.idx, promptWords: tokPromptWords}
	content := "tok" + strconv.Itoa(n) + strings.Repeat(" w", tokPromptWords-1)
	b, _ := json.Marshal(tokBody{Model: "atk-tok", MaxTokens: q.maxTokens, Stream: q.stream,
		Messages: []tokMessage{{Role: "user", Content: content}}})
	q.bodyLen = len(b)
	q.admitted = admittedCost(tl.price, q.bodyLen, q.stream, q.maxTokens)
	gen := rp.generation()
	q.proc = fmt.Sprintf("%s#%d", rp.name(), gen)
	key := tl.keyFor(rp, gen)
	q.keyID = key.id
	q.sent = time.Now()
	defer func() {
		q.done = time.Now()
		q.changed = rp.generation() != gen
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rp.base+"/api/v1/proxy/"+tl.inst.ID+"/v1/chat/completions",
		bytes.NewReader(b))
	if err != nil {
		q.why = "transport"
		return q
	}
	req.Header.Set("X-API-Key", key.secret)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", q.rid)
	resp, err := a.hc.Do(req)
	if err != nil {
		q.why = "transport"
		return q
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	q.status = resp.StatusCode
	switch {
	case err != nil:
		q.why = strconv.Itoa(q.status) + " cut"
	case q.status == http.StatusOK && q.stream:
		q.ok, q.completion, q.usageInSSE = readTokStream(body)
		q.prompt = q.promptWords // not in the stream: the client did not ask for its usage
	case q.status == http.StatusOK:
		var v struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(body, &v) == nil && len(v.Choices) > 0 && v.Usage != nil {
			q.ok, q.prompt, q.completion = true, v.Usage.Prompt, v.Usage.Completion
		}
	case q.status == http.StatusPaymentRequired:
		q.refusal = readTokRefusal(body)
	}
	switch {
	case q.ok:
		q.why = "200"
	case q.status == http.StatusOK:
		q.why = "200 truncated"
	case q.why == "":
		q.why = outcome(reply{status: q.status, body: body})
	}
	return q
}

// readTokStream reads a streamed answer: whether it ended with [DONE],
// its content chunks (the simulated model streams one token each), and
// whether a chunk carried usage.
func readTokStream(body []byte) (done bool, chunks int64, usage bool) {
	for _, ev := range strings.Split(string(body), "\n\n") {
		data, ok := strings.CutPrefix(strings.TrimSpace(ev), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &c) != nil {
			continue
		}
		if len(c.Usage) > 0 && string(c.Usage) != "null" {
			usage = true
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			chunks++
		}
	}
	return done, chunks, usage
}

// readTokRefusal reads a spending refusal's code, message and details.
func readTokRefusal(body []byte) *tokRefusal {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Details struct {
				Scope   string      `json:"scope"`
				KeyID   string      `json:"key_id"`
				Minutes int         `json:"window_minutes"`
				Cost    json.Number `json:"cost"`
				Remain  json.Number `json:"remaining"`
			} `json:"details"`
		} `json:"error"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if d.Decode(&e) != nil {
		return &tokRefusal{}
	}
	r := &tokRefusal{code: e.Error.Code, message: e.Error.Message, scope: e.Error.Details.Scope,
		keyID: e.Error.Details.KeyID, minutes: e.Error.Details.Minutes}
	if c := string(e.Error.Details.Cost); c != "" {
		r.cost, r.hasCost = parseMicros(c), true
	}
	r.remaining = parseMicros(string(e.Error.Details.Remain))
	return r
}

// parseMicros reads a dollar decimal ("0.123456", "12", "-0.5") as
// micro-dollars; -1 when it is not one.
func parseMicros(s string) int64 {
	neg := strings.HasPrefix(s, "-")
	if neg {
		if m := parseMicros(s[1:]); m >= 0 {
			return -m
		}
		return -1
	}
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) > 6 || whole == "" {
		return -1
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w < 0 {
		return -1
	}
	f := int64(0)
	if frac != "" {
		if f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
			return -1
		}
	}
	return w*1_000_000 + f
}
