// Package economics answers what tokens cost: per instance, model, API key
// or service over a period, the requests and tokens that went through
// the proxy and the services' endpoint, the GPU cost of the instances that
// served them (their ledger charges in the period, idle time included),
// the proxy charges, the cost per million output tokens and per million
// tokens, and utilization (time with a request in flight over time
// running). REST (GET /api/v1/usage/summary, JSON and CSV), the console
// and MCP read it through Service.
//
// # Period
//
// A query covers [From, To) of one account: by default the last seven
// days (To now, From seven days before To), at most 366 days. A request
// counts in the period its arrival (Usage.At) falls in; a ledger entry in
// the period its time falls in. Metering dates each charge at the end of
// the time it covers (a tick a minute), so a boundary cuts an instance's
// charges at the tick nearest it; a prepaid instance's charge falls when
// it was rented, its refund when it was destroyed.
//
// # GPU cost
//
// An instance's GPU cost in the period is the net of the ledger entries
// that name it: charges and adjustments add, refunds subtract. Settled
// proxy leases also name an instance, but they are what its requests were
// charged (ProxyCharges, from the usage records), not what the GPU cost,
// and are left out.
//
// # Allocation
//
//   - By instance, each row is one instance's own figures: its GPU cost is
//     its ledger charges in the period. Requests that reached no instance
//     form the row "".
//   - By key, a row's GPU cost is the ledger's attribution: an instance's
//     entries name the key that created it (the ledger's key_id), so its
//     GPU cost, idle time included, is that key's, whoever called it; a
//     key's proxy charges are its own calls' (the calling key, as the
//     ledger's settled proxy charges name it). Charged is what the
//     ledger charged the key in the period (every entry attributed to
//     it: charges and adjustments less refunds), the same figure as the
//     ledger's summary by key and the console's. GPU cost shared by
//     token share is the separate column SharedGPUCost
//     (gpu_cost_by_token_share), split as by model; the costs per million
//     tokens use it, as they answer what the key's tokens cost.
//   - By model, key (SharedGPUCost) or service, each instance's GPU cost is split over the
//     groups whose requests it served in the period, by their share of its
//     tokens (prompt + completion); with no tokens on it, by their share
//     of its requests; with no requests, it goes whole to the group ""
//     (GPU time no request used; by key, to the key that created it). By
//     model, a request through a service counts under the service's
//     model (the name callers ask for), whatever name the upstream
//     answered with (kept as Row.Upstream); models whose requests all
//     failed (status 400 and above, or none) with no tokens, charges or
//     GPU cost fold into the one row ErrorsOnly. By service, a request's group is its
//     own service (Usage.ServiceID; requests through the instance proxy
//     have none), and an instance no request used goes to the service it
//     is a replica of ("" when it is none). Services are shown by name.
//   - Shares are integer micro-dollars, each rounded toward zero; what
//     rounding leaves goes to the largest share (the first group by name
//     among equal ones), so the rows' GPU costs sum exactly to the
//     instances' charges.
//
// # Figures
//
//   - Requests, errors (answered 5xx, or not answered), tokens and proxy
//     charges are sums of the group's usage records.
//   - Cost per million tokens is SharedGPUCost × 1,000,000 / tokens, rounded
//     half away from zero (half up for a cost that is not negative), in
//     micro-dollars: per million completion tokens (PerMillionOutput) and
//     per million prompt + completion tokens (PerMillionTokens); nil
//     without such tokens.
//   - Busy is the union of [At, At+Latency] of the group's requests on
//     each instance, clipped to the period and to that instance's running
//     time, summed over instances. Running is the running time in the
//     period of the instances the group's requests used, and of those no
//     request used whose GPU time went to the group (by instance: its own).
//     An instance runs from its start (StartedAt) to when it was
//     terminated, stopped or its meter stopped, whichever came first, or
//     to now. Utilization is Busy / Running (0 when not running).
//     BusyGPUCost is SharedGPUCost × Busy / Running (toward zero): the
//     part of the GPU cost with a request in flight; the rest is idle.
//     PerMillionOutputBusy is BusyGPUCost per million completion tokens,
//     shown beside the all-in figure so idle GPUs cannot pass for
//     expensive tokens.
//   - Totals sum the rows' requests, errors, tokens, GPU cost and proxy
//     charges, and compute cost per million tokens on those sums. Busy and
//     Running in the totals are the account's: every instance of the
//     period counted once (an instance two groups used is in both rows'
//     Running, once in the totals), so the totals' utilization is the
//     fleet's.
//
// Series gives the same allocation per bucket of the period (GPU cost,
// completion tokens and cost per million output tokens per group), for a
// chart of cost per million tokens over time.
package economics
