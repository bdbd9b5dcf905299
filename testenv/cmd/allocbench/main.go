// Command allocbench times the scheduler's own device allocator (the package the
// kube-scheduler's DRA plugin calls for every pod and candidate node) over slices and
// claims read from a JSON file, so that slice layouts can be compared by what they cost
// the scheduler without a cluster.
//
// Input (stdin): {"classes": [DeviceClass], "slices": [ResourceSlice], "iterations": N,
// "cases": [{"name", "node", "claim": ResourceClaim, "allocated": ["driver/pool/device"],
// "shared": [{"device": "driver/pool/device", "capacity": {name: quantity}}]}]}. Output (stdout): one JSON line per case with the
// nanoseconds one Allocate call takes for that node and whether it found devices.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type benchCase struct {
	Name      string                    `json:"name"`
	Node      string                    `json:"node"`
	Claim     resourceapi.ResourceClaim `json:"claim"`
	Allocated []string                  `json:"allocated"`
	Shared    []share                   `json:"shared"`
}

// share is one allocation of a device that allows several, with the capacity it took.
type share struct {
	Device   string                                          `json:"device"`
	Capacity map[resourceapi.QualifiedName]resource.Quantity `json:"capacity"`
}

type input struct {
	Classes    []resourceapi.DeviceClass   `json:"classes"`
	Slices     []resourceapi.ResourceSlice `json:"slices"`
	Iterations int                         `json:"iterations"`
	Cases      []benchCase                 `json:"cases"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

func deviceID(s string) (structured.DeviceID, error) {
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 {
		return structured.DeviceID{}, fmt.Errorf("%q is not driver/pool/device", s)
	}
	return structured.MakeDeviceID(parts[0], parts[1], parts[2]), nil
}

// features are those the scheduler of 1.37 turns on by default, plus what the layouts use.
var features = structured.Features{
	AdminAccess:            true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
	DeviceTaints:           true,
	PartitionableDevices:   true,
	PrioritizedList:        true,
}

func run(in input) error {
	ctx := context.Background()
	lister := classes{}
	for i := range in.Classes {
		lister[in.Classes[i].Name] = &in.Classes[i]
	}
	slices := make([]*resourceapi.ResourceSlice, len(in.Slices))
	for i := range in.Slices {
		slices[i] = &in.Slices[i]
	}
	// The scheduler's cache holds ten compiled expressions (dynamicresources.go).
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	enc := json.NewEncoder(os.Stdout)
	for _, c := range in.Cases {
		state := structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}
		for _, name := range c.Allocated {
			id, err := deviceID(name)
			if err != nil {
				return err
			}
			state.AllocatedDevices.Insert(id)
		}
		for i, s := range c.Shared {
			id, err := deviceID(s.Device)
			if err != nil {
				return err
			}
			uid := types.UID(fmt.Sprintf("share-%d", i))
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &uid))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, s.Capacity))
		}
		node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.Node}}
		claim := c.Claim
		iterations := max(in.Iterations, 1)
		var found int
		start := time.Now()
		for range iterations {
			// As the scheduler does: one allocator per pod (PreFilter), one Allocate per
			// candidate node (Filter).
			alloc, err := structured.NewAllocator(ctx, features, state, lister, slices, cache)
			if err != nil {
				return err
			}
			result, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{&claim})
			if err != nil {
				return fmt.Errorf("%s: %w", c.Name, err)
			}
			found = 0
			if len(result) == 1 {
				found = len(result[0].Devices.Results)
			}
		}
		per := time.Since(start).Nanoseconds() / int64(iterations)
		if err := enc.Encode(map[string]any{"name": c.Name, "ns": per, "devices": found}); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	profile := flag.String("cpuprofile", "", "write a CPU profile of all cases to this file")
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "allocbench:", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "allocbench:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "allocbench: reading input:", err)
		os.Exit(2)
	}
	if err := run(in); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "allocbench:", err)
		os.Exit(1)
	}
}
