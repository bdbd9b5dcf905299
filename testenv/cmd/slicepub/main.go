// Command slicepub publishes node pools with the upstream ResourceSlice controller
// (k8s.io/dynamic-resource-allocation/resourceslice, what Go kubelet plugins use), one
// controller per node as each node's plugin runs it, so the scale benchmark can compare its
// writes, bytes and time with the agent's own publisher on the same pools.
//
// Input (-pools, JSON): [{"node": name, "slices": [{"devices": [...], "sharedCounters":
// [...]}]}]. It prints "ready" once the controllers are built, waits for a line on stdin,
// starts them, and on SIGTERM prints {"requests", "writes", "writeBytes"} and exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

type slice struct {
	Devices        []resourceapi.Device     `json:"devices"`
	SharedCounters []resourceapi.CounterSet `json:"sharedCounters"`
}

type pool struct {
	Node   string  `json:"node"`
	Slices []slice `json:"slices"`
}

// counting counts the requests sent and the bytes of those that write.
type counting struct {
	next                     http.RoundTripper
	requests, writes, nbytes atomic.Int64
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	if req.Method != http.MethodGet {
		c.writes.Add(1)
		if req.ContentLength > 0 {
			c.nbytes.Add(req.ContentLength)
		}
	}
	return c.next.RoundTrip(req)
}

func run(kubeconfig, driver, poolsFile string) error {
	var pools []pool
	data, err := os.ReadFile(poolsFile)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &pools); err != nil {
		return fmt.Errorf("%s: %w", poolsFile, err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// As lifted for the scheduler: the controllers, not a client-side limiter, are measured.
	config.QPS, config.Burst = 5000, 5000
	counter := &counting{}
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		counter.next = rt
		return counter
	})
	client, err := kubernetes.NewForConfig(rest.CopyConfig(config))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	// Each node's plugin starts its own controller; starting one blocks until its cache
	// synced, so they are started side by side, as on separate nodes.
	errs := make(chan error, len(pools))
	for _, p := range pools {
		go func() {
			slices := make([]resourceslice.Slice, len(p.Slices))
			for i, s := range p.Slices {
				slices[i] = resourceslice.Slice{Devices: s.Devices, SharedCounters: s.SharedCounters}
			}
			_, err := resourceslice.StartController(ctx, resourceslice.Options{
				DriverName: driver,
				KubeClient: client,
				Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.Node},
				Resources: &resourceslice.DriverResources{
					Pools: map[string]resourceslice.Pool{p.Node: {Slices: slices}},
				},
			})
			if err != nil {
				err = fmt.Errorf("node %s: %w", p.Node, err)
			}
			errs <- err
		}()
	}
	for range pools {
		if err := <-errs; err != nil {
			return err
		}
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
	return json.NewEncoder(os.Stdout).Encode(map[string]int64{
		"requests":   counter.requests.Load(),
		"writes":     counter.writes.Load(),
		"writeBytes": counter.nbytes.Load(),
	})
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	driver := flag.String("driver", "", "the driver name to publish as")
	pools := flag.String("pools", "", "JSON file with the pools to publish")
	flag.Parse()
	if err := run(*kubeconfig, *driver, *pools); err != nil {
		fmt.Fprintln(os.Stderr, "slicepub:", err)
		os.Exit(1)
	}
}
