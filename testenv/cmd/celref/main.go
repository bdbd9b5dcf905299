// Command celref compiles and evaluates DRA device selectors exactly as the
// kube-scheduler does, so that other CEL implementations can be compared
// against it.
//
// It reads requests from stdin, one JSON object per line:
//
//	{"selectors": ["device.driver == \"a\""],
//	 "devices": [{"driver": "a", "device": {"name": "d", "attributes": {...}}}]}
//
// and writes one JSON line per request:
//
//	{"selectors": [{"compiled": true, "error": "", "results": [
//	   {"verdict": "true"|"false"|"error", "error": "..."}, ...]}],
//	 "devices": ["" or the reason the device could not be decoded, ...]}
//
// Selectors are compiled by the scheduler's cache (cel.NewCache(...).GetOrCompile:
// stored-expressions environment, no cost estimation, the API's runtime cost
// limit) with the feature gates the scheduler enables by default in this
// release; runtime errors pass through cel.EnhanceRuntimeError as in the
// allocator.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

type inputDevice struct {
	Driver string          `json:"driver"`
	Device json.RawMessage `json:"device"`
}

type request struct {
	Selectors []string      `json:"selectors"`
	Devices   []inputDevice `json:"devices"`
}

type verdict struct {
	Verdict string `json:"verdict"`
	Error   string `json:"error,omitempty"`
}

type selectorResult struct {
	Compiled bool      `json:"compiled"`
	Error    string    `json:"error,omitempty"`
	Results  []verdict `json:"results"`
}

type response struct {
	Selectors []selectorResult `json:"selectors"`
	Devices   []string         `json:"devices"`
	Error     string           `json:"error,omitempty"`
}

type device struct {
	input cel.Device
	err   string
}

func decodeDevices(in []inputDevice) []device {
	out := make([]device, len(in))
	for i, d := range in {
		var api resourceapi.Device
		if err := json.Unmarshal(d.Device, &api); err != nil {
			out[i].err = err.Error()
			continue
		}
		out[i].input = cel.Device{
			Driver:                   d.Driver,
			AllowMultipleAllocations: api.AllowMultipleAllocations,
			Attributes:               api.Attributes,
			Capacity:                 api.Capacity,
		}
	}
	return out
}

func evaluate(ctx context.Context, cache *cel.Cache, req request) response {
	devices := decodeDevices(req.Devices)
	resp := response{Devices: make([]string, len(devices)), Selectors: make([]selectorResult, len(req.Selectors))}
	for i, d := range devices {
		resp.Devices[i] = d.err
	}
	for i, expression := range req.Selectors {
		expr := cache.GetOrCompile(expression)
		if expr.Error != nil {
			resp.Selectors[i] = selectorResult{Error: expr.Error.Error()}
			continue
		}
		results := make([]verdict, len(devices))
		for j, d := range devices {
			if d.err != "" {
				results[j] = verdict{Verdict: "error", Error: d.err}
				continue
			}
			matches, _, err := expr.DeviceMatches(ctx, d.input)
			switch {
			case err != nil:
				results[j] = verdict{Verdict: "error", Error: cel.EnhanceRuntimeError(err).Error()}
			case matches:
				results[j] = verdict{Verdict: "true"}
			default:
				results[j] = verdict{Verdict: "false"}
			}
		}
		resp.Selectors[i] = selectorResult{Compiled: true, Results: results}
	}
	return resp
}

func main() {
	consumable := flag.Bool("consumable-capacity", true, "DRAConsumableCapacity feature gate (beta, on by default)")
	listAttrs := flag.Bool("list-type-attributes", false, "DRAListTypeAttributes feature gate (alpha, off by default)")
	flag.Parse()

	// The scheduler keeps the 10 most recent selectors; the size only affects speed.
	features, err := celFeatures(*consumable, *listAttrs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "celref:", err)
		os.Exit(2)
	}
	cache := cel.NewCache(10, features)
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 1<<30)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for in.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp.Error = fmt.Sprintf("bad request: %v", err)
		} else {
			resp = evaluate(ctx, cache, req)
		}
		if err := enc.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
