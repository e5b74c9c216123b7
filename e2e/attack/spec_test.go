package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Rent by spec (issue 20): many callers on every replica ask at once for
// "a single cheap GPU on vast.ai under a cap" instead of an offer id. Each
// call ranks the live offers and fails over, offer by offer, while other
// callers (and the simulator's offer churn) take them. The attack holds
// them to what the spec promises: distinct offers, never one rented twice,
// never past a limit, and an Idempotency-Key that never rents twice
// however often, wherever and however concurrently it is sent again.

// specAccount is the account of the by-spec creates: $0.50 per 60 min
// (raised by $0.25 a wave) and $4 per 24 h, so that two or three rentals
// of the cheapest offers fill it and the herd's admissions contest it.
const specAccount = "atk-spec"

// The spec every by-spec create sends: one GPU of these, at most specCap
// per hour, on vast.ai (one machine per offer, so two rentals of one offer
// would be a double rent), trying at most specMaxAttempts offers.
// Broad, so that enough machines match: offer churn leaves about half the
// market listed.
var specGPUs = []string{"RTX 3080", "RTX 3090", "RTX 4090", "RTX 5090", "RTX A5000", "RTX A6000", "L4", "L40S", "A100", "H100"}

const (
	specCap         = 2.0 // USD per hour
	specProvider    = "vast.ai"
	specMaxAttempts = 5
	// offerChurn is the simulators' --offer-churn: the share of the offers
	// a search (or a quote) lists that someone else rents right after, so
	// by-spec creates meet offers gone and fail over. Every by-spec call
	// searches afresh and quotes each offer it tries, so between one
	// caller's search and its quote the herd lists an offer some 30 times:
	// at 0.03 it survives that about two times in five (0.97^30); at 0.2
	// almost never, and nothing is rented.
	offerChurn = 0.03
	// specResends bounds how often one call is sent again while its
	// outcome is unknown (a transport error, a 5xx) or still running
	// elsewhere (409 conflict), and specRunningResends how many of those
	// answers may say running: a call whose replica was SIGKILLed (or that
	// lost the database) stays running for minutes, so its caller gives up
	// and the database says what became of it.
	specResends        = 5
	specRunningResends = 2
	// One call in specDupEvery is sent again once its answer is final (it
	// must get the same answer); one in specRaceEvery is sent to two
	// replicas at once from the start.
	specDupEvery  = 4
	specRaceEvery = 8
	// specDestroyPct of the rented instances are destroyed soon after, so
	// their machines come back to the market (under new ask ids); the
	// rest keep theirs, and run metered, to the end.
	specDestroyPct = 90
)

// specAttempt is one offer a rent by spec tried, as the API shows it.
type specAttempt struct {
	Provider     string  `json:"provider"`
	OfferID      string  `json:"offer_id"`
	GPUName      string  `json:"gpu_name"`
	PricePerHour float64 `json:"price_per_hour"`
	Outcome      string  `json:"outcome"`
	Error        string  `json:"error"`
	DurationMS   int64   `json:"duration_ms"`
}

// specInstance is the part of a 201/202 answer the checks read.
type specInstance struct {
	ID           string        `json:"id"`
	Provider     string        `json:"provider"`
	OfferID      string        `json:"offer_id"`
	GPUName      string        `json:"gpu_name"`
	NumGPUs      int           `json:"num_gpus"`
	PricePerHour float64       `json:"price_per_hour"`
	Status       string        `json:"status"`
	Attempts     []specAttempt `json:"attempts"`
}

// specCall is one by-spec create as its caller saw it: every answer to
// every send of its Idempotency-Key.
type specCall struct {
	idem    string
	key     *attackKey
	race    bool    // sent to two replicas at once from the start
	dup     bool    // sent again once its answer was final
	answers []reply // in the order received
	final   reply   // the first final answer; status 0: none (unresolved)
	inst    specInstance
	resends int // sends after the first (the racing twin included)
	retries int // sends while the outcome was unknown or still running
}

// specState is what an answer says of the call: "final" (an instance, or
// an error a retry must repeat), "running" (409 conflict: the same key's
// call is still trying offers elsewhere) or "unknown" (a transport error
// or a 5xx: the call may or may not have happened).
func specState(r reply) string {
	switch {
	case r.retryable():
		return "unknown"
	case r.status == http.StatusConflict && r.errorCode() == "conflict" && r.retryAfter():
		return "running"
	}
	return "final"
}

// retryAfter reports whether an error's details name retry_after_seconds.
func (r reply) retryAfter() bool {
	var e struct {
		Error struct {
			Details struct {
				RetryAfter *int `json:"retry_after_seconds"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Details.RetryAfter != nil
}

// attempts are the offers an answer says were tried: a 201/202's
// instance's, or an error's details.attempts.
func (r reply) attempts() []specAttempt {
	var e struct {
		Attempts []specAttempt `json:"attempts"`
		Error    struct {
			Details struct {
				Attempts []specAttempt `json:"attempts"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	if len(e.Attempts) > 0 {
		return e.Attempts
	}
	return e.Error.Details.Attempts
}

// rented reports whether the status is a create's success.
func rented(status int) bool { return status == http.StatusCreated || status == http.StatusAccepted }

func (c *specCall) add(r reply) {
	c.answers = append(c.answers, r)
	if c.final.status != 0 || specState(r) != "final" {
		return
	}
	c.final = r
	if rented(r.status) {
		_ = json.Unmarshal(r.body, &c.inst)
	}
}

// last is the answer the caller ended with.
func (c *specCall) last() reply {
	if c.final.status != 0 {
		return c.final
	}
	if len(c.answers) == 0 {
		return reply{err: fmt.Errorf("never sent")}
	}
	return c.answers[len(c.answers)-1]
}

// specBody is the create request of every by-spec call.
func specBody() map[string]any {
	return map[string]any{
		"spec": map[string]any{"gpu": specGPUs, "num_gpus": 1, "max_price_per_hour": specCap,
			"providers": specProvider, "max_attempts": specMaxAttempts},
		"image": "vllm/vllm-openai:latest", "env": map[string]string{"MODEL": "attack"}, "ports": []int{8000}}
}

// specCreate sends one by-spec create with its Idempotency-Key (to two
// replicas at once when race), sends it again to the next replica while
// its outcome is unknown or still running, up to specResends times, and
// once more when dup after a final answer, as a careful client (or two
// of them) would.
func (a *api) specCreate(ctx context.Context, replica int, k *attackKey, idem string, race, dup bool) *specCall {
	c := &specCall{idem: idem, key: k, race: race}
	body, hdr := specBody(), map[string]string{"Idempotency-Key": idem}
	send := func(r int) reply { return a.do(ctx, r, http.MethodPost, "/api/v1/gpu/instances", k.secret, body, hdr) }
	if race {
		var twin reply
		var wg sync.WaitGroup
		wg.Go(func() { twin = send(replica + 1) })
		first := send(replica)
		wg.Wait()
		c.add(first)
		c.add(twin)
		c.resends++
	} else {
		c.add(send(replica))
	}
	running := 0
	for try := 1; c.final.status == 0 && try <= specResends && ctx.Err() == nil; try++ {
		if specState(c.answers[len(c.answers)-1]) == "running" {
			if running++; running > specRunningResends {
				break
			}
		}
		// pace: a client's resend backoff.
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
		c.add(send(replica + try))
		c.resends++
		c.retries++
	}
	if dup && c.final.status != 0 && ctx.Err() == nil {
		// pace: the duplicate comes a moment after the answer.
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		c.add(send(replica + len(c.answers)))
		c.resends++
		c.dup = true
	}
	return c
}

// specLoad is the by-spec creates of the whole run.
type specLoad struct {
	churn  float64 // the simulators' offer churn (0: the sim build has none)
	mu     sync.Mutex
	calls  []*specCall
	probed reply // the no_matching_offer answer to a spec under every offer
}

// probeSpec asks, before the attack, for the spec under a cap below every
// offer: a build with rent by spec answers 409 no_matching_offer naming
// the nearest miss (and rents nothing); one without refuses the request
// as invalid, and the by-spec load is left out.
func probeSpec(ctx context.Context, a *api, key string) (supported bool, r reply, err error) {
	body := specBody()
	body["spec"].(map[string]any)["max_price_per_hour"] = 0.000001
	r = a.do(ctx, 0, http.MethodPost, "/api/v1/gpu/instances", key, body, nil)
	switch {
	case r.status == http.StatusConflict && r.errorCode() == "no_matching_offer":
		return true, r, nil
	case r.err == nil && r.status/100 == 4 && r.errorCode() == "invalid":
		return false, r, nil
	}
	return false, r, fmt.Errorf("probing rent by spec: want 409 no_matching_offer (or a 4xx invalid from a build without it), got %s", r)
}

// nearestMisses are a no_matching_offer answer's details.nearest_misses.
func (r reply) nearestMisses() []string {
	var e struct {
		Error struct {
			Details struct {
				Misses []string `json:"nearest_misses"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Details.Misses
}

// call makes by-spec create n through key k and records it (the key's
// outcome and, when it rented, its instance).
func (sl *specLoad) call(ctx context.Context, a *api, n int, k *attackKey) *specCall {
	c := a.specCreate(ctx, n, k, fmt.Sprintf("spec-%d", n), n%specRaceEvery == specRaceEvery-1, n%specDupEvery == 1)
	sl.mu.Lock()
	sl.calls = append(sl.calls, c)
	sl.mu.Unlock()
	k.record(c.last())
	if c.inst.ID != "" {
		k.mu.Lock()
		k.admitted += c.inst.PricePerHour * horizon.Hours()
		k.instances = append(k.instances, c.inst.ID)
		k.mu.Unlock()
	}
	return c
}

// micros converts a USD amount of the API (six decimals at most) to
// micro-dollars.
func micros(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// matchesSpec reports whether a GPU name is one the spec asks for, as the
// offer search matches it (case-insensitive substring).
func matchesSpec(gpu string) bool {
	for _, g := range specGPUs {
		if strings.Contains(strings.ToLower(gpu), strings.ToLower(g)) {
			return true
		}
	}
	return false
}
