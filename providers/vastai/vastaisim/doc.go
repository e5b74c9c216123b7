// Package vastaisim is an in-process simulator of vast.ai's REST API for
// tests and the sandbox (gpuproxy serve --sandbox). It speaks the real wire
// format recorded in the shared notes (providers/vastai.md), and accepts
// the official client's (vast-cli's vast.py) requests as sent:
//
//   - POST /api/v0/bundles/ evaluates the flat filter language (eq, neq, gt,
//     gte, lt, lte, in, notin) with order, limit, type and
//     allocated_storage; gpu_ram is MB and dph_total USD/hour for the whole
//     offer, storage included. Values the client sends as strings
//     ({"num_gpus":{"eq":"1"}}, {"dph_total":{"lt":"2"}}) are read as
//     numbers or booleans by the field's kind, driver versions as the
//     client's numbers; a value that cannot be read is a 400 naming the
//     field.
//   - GET /api/v0/gpu_names/unique/ answers {"gpu_names":[...]} without a
//     key, as vast.py asks for it before anything else.
//   - PUT /api/v0/asks/{id}/ rents an offer: it leaves the market, and a
//     second rent gives 410 no_such_ask (404 for an unknown id). A price
//     makes a bid; target_state "stopped" creates it stopped; type is
//     accepted and ignored. cancel_unavail decides what a create on a
//     machine someone else holds gets: 410 (the default on demand), or a
//     stopped instance (false, the CLI's default).
//   - Instances go actual_status null → loading → running after StartDelay;
//     a running instance serves an OpenAI-compatible InferenceServer on its
//     own loopback port, published as public_ipaddr 127.0.0.1 and
//     ports {"8000/tcp":[{"HostIp":"0.0.0.0","HostPort":"<port>"}]}.
//     PUT {"state":"stopped"|"running"} stops and restarts one.
//   - GET /api/v1/instances/ pages 25 at a time with next_token/after_token;
//     GET /api/v0/instances/{id}/ answers {"instances":{...}} or
//     {"instances":null}; DELETE destroys, then answers 404 not_found.
//   - Billing is vast.ai's: storage (storage_cost $/GB/month × disk) from
//     creation to destroy, GPU time (dph_base, or the bid) only while
//     running, each GPU period at the bid then in force. GET
//     /api/v0/users/current/ (credit) and GET /api/v0/charges/ (per
//     instance, with gpu and disk items) report it alike.
//   - type "bid" (or "interruptible") searches return interruptible rows:
//     is_bid true, priced at min_bid (20–50% of on-demand, as vast.ai's
//     "50–80%" cheaper). PUT /api/v0/search/asks/ ({"select_cols","q"}, the
//     CLI's --new) answers as bundles does.
//   - PUT /api/v0/instances/bid_price/{id}/ changes a bid (a null price
//     takes the winning one); PUT /api/v0/instances/reboot/{id}/ restarts
//     the container without losing priority; PUT
//     /api/v0/instances/request_logs/{id}/ answers a result_url served
//     without a key; GET /api/v1/invoices/ lists the starting credit. The
//     charges and invoices pages hold at most 100 results, and every
//     result and line item has start, end, type, source, description,
//     amount, metadata and items (what vast.py's --verbose reads).
//   - Options.Market makes the market move (market.go): on-demand
//     outranks interruptible and the highest bid wins; an outranked
//     instance is paused (stopped, storage billed) and resumes by itself;
//     a seeded hazard or a trace (ParseTrace) drives it; prices walk
//     within bounds; hosts leave and arrive; a floor of single-GPU offers
//     refills.
//   - Offer churn (Options.OfferChurn) lets someone else rent a share of
//     the offers each search lists, deterministically under Options.Seed,
//     so that failover across offers can be exercised end to end.
//
// Paths match with or without the trailing slash. Authentication, error
// bodies ({"success":false,"error":slug,"msg":text}) and 429s without
// Retry-After follow vast.ai. Faults (latency, 429, 5xx, hangs, dropped
// connections, 200 with success:false, ambiguous creates, verbatim replies)
// and per-endpoint rate limits can be switched on at run time.
package vastaisim
