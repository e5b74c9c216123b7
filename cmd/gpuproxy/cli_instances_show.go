package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// `instances list [--status S]` and `instances show ID`: the account's
// instances as GET /api/v1/gpu/instances and GET …/{id} answer them, with
// each one's market (on-demand, or interruptible with its bid) and the
// provider's own words on its status (why it was preempted).

// instancesListUsage is the overview's entries for `instances list` and
// `instances show`.
const instancesListUsage = `  instances list [--status S]                 the account's instances: status, market (interruptible with
                                              its bid), price, cost to date and the provider's status message
  instances show ID                           one instance, with its lifetime rules and the offers tried`

// cmdInstancesShow runs `instances list` and `instances show ID` (args:
// the subcommand and, for show, the id).
func cmdInstancesShow(ctx context.Context, args []string, status string, set map[string]bool, srv apiServer,
	stdout io.Writer) error {
	sub := args[0]
	for name := range set {
		if name == "url" || name == "c" || sub == "list" && name == "status" {
			continue
		}
		return fmt.Errorf("--%s: not a flag of instances %s (gpuproxy instances %s --help lists them)", name, sub, sub)
	}
	if sub == "show" {
		if len(args) != 2 || args[1] == "" {
			return errors.New("usage: gpuproxy instances show ID")
		}
		inst, err := callAPI(ctx, http.MethodGet, srv, "/api/v1/gpu/instances/"+url.PathEscape(args[1]), "", nil,
			lifetimeFlagOf, io.Discard)
		if err != nil {
			return err
		}
		return printInstance(stdout, inst)
	}
	if len(args) != 1 {
		return errors.New("usage: gpuproxy instances list [--status S]")
	}
	path := "/api/v1/gpu/instances"
	if status != "" {
		path += "?status=" + url.QueryEscape(status)
	}
	var list struct {
		Instances []instanceReply `json:"instances"`
	}
	if err := getJSON(ctx, srv, path, map[string]string{"status": "--status"}, &list); err != nil {
		return err
	}
	if len(list.Instances) == 0 {
		_, err := fmt.Fprintln(stdout, "no instances")
		return err
	}
	rows := [][]any{{"ID", "PROVIDER", "GPU", "STATUS", "MARKET", "BID/H", "PRICE/H", "COST", "STATUS MESSAGE"}}
	for _, in := range list.Instances {
		bid := any("-")
		if in.BidPerHour > 0 {
			bid = in.BidPerHour
		}
		msg := in.StatusMsg
		if msg == "" {
			msg = "-"
		}
		rows = append(rows, []any{in.ID, in.Provider, instanceGPU(in), in.Status, in.Market, bid, in.PricePerHour,
			in.CostToDate, msg})
	}
	return writeTable(stdout, rows)
}

// printInstance prints one instance: what it is, its market, status and
// the provider's words on it, its lifetime rules and the offers tried.
func printInstance(w io.Writer, inst instanceReply) error {
	fmt.Fprintf(w, "%s: %s on %s (offer %s), %s\n", inst.ID, instanceGPU(inst), inst.Provider, inst.OfferID, inst.Status)
	fmt.Fprintf(w, "market: %s\n", marketLine(inst))
	fmt.Fprintf(w, "price: %s/h, cost to date %s\n", usd(inst.PricePerHour), usd(inst.CostToDate))
	if inst.StatusMsg != "" {
		fmt.Fprintf(w, "%s says: %s\n", inst.Provider, inst.StatusMsg)
	}
	return printInstanceTail(w, inst)
}

// marketLine is an instance's market: "on-demand", or "interruptible, bid
// $0.12/h for the GPUs (storage excluded)".
func marketLine(inst instanceReply) string {
	if inst.BidPerHour > 0 {
		return fmt.Sprintf("%s, bid %s/h for the GPUs (storage excluded)", inst.Market, usd(inst.BidPerHour))
	}
	return inst.Market
}

// instanceGPU is "RTX 4090", or "2× RTX 4090".
func instanceGPU(inst instanceReply) string {
	if inst.NumGPUs > 1 {
		return fmt.Sprintf("%d× %s", inst.NumGPUs, inst.GPUName)
	}
	return inst.GPUName
}

// getJSON GETs path from the server into v, turning the API's error into
// one naming the CLI's flags (names: API field → flag).
func getJSON(ctx context.Context, srv apiServer, path string, names map[string]string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, instancesTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.base+path, nil)
	if err != nil {
		return fmt.Errorf("--url %s: %w", srv.base, err)
	}
	req.Header.Set("X-API-Key", srv.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return srv.unreachable(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, maxListReply))
	if err != nil {
		return fmt.Errorf("reading the answer of GET %s: %w", path, err)
	}
	if res.StatusCode/100 == 2 {
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("GET %s: HTTP %d with an answer that is not JSON: %.200s", path, res.StatusCode, raw)
		}
		return nil
	}
	e, ok := apiError(raw)
	if !ok {
		return fmt.Errorf("GET %s: HTTP %d: %.200s", path, res.StatusCode, strings.TrimSpace(string(raw)))
	}
	return argErr(e, names, nil)
}

// maxListReply bounds the instance list the CLI reads.
const maxListReply = 16 << 20
