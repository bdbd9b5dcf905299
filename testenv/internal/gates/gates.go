// Package gates is the one place that decides which feature gates and API
// versions the local control plane enables for Dynamic Resource Allocation.
//
// The gate list is computed from the pinned release's own feature registry
// (k8s.io/kubernetes/pkg/features registers every Kubernetes gate in
// utilfeature.DefaultMutableFeatureGate), so a version bump picks up new DRA
// gates without editing this file.
package gates

import (
	"fmt"
	"sort"
	"strings"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"

	// Registers all Kubernetes feature gates and their dependencies.
	_ "k8s.io/kubernetes/pkg/features"
)

// extra lists gates that belong to DRA without "DRA" in their name.
var extra = map[featuregate.Feature]bool{
	"DynamicResourceAllocation":           true,
	"ResourceHealthStatus":                true,
	"ResourceHealthStatusMessage":         true,
	"KubeletPodResourcesDynamicResources": true,
}

// exclude lists gates that must not be enabled even though they match.
// Empty for now; a gate added here drops every selected gate depending on it.
var exclude = map[featuregate.Feature]string{}

// RuntimeConfig lists the API group versions that the DRA gates need served
// in addition to the defaults (beta and alpha versions are off by default).
var RuntimeConfig = []string{
	"resource.k8s.io/v1beta1",
	"resource.k8s.io/v1beta2",
	"resource.k8s.io/v1alpha3",
	"scheduling.k8s.io/v1beta1",
}

// Gate describes one selected gate.
type Gate struct {
	Name    string
	Stage   string
	Default bool
	Reason  string // why it was selected
}

func matches(name featuregate.Feature) bool {
	return strings.Contains(string(name), "DRA") || extra[name]
}

// Selected returns the DRA feature gates of the pinned release, including
// every gate they depend on, sorted by name.
func Selected() ([]Gate, error) {
	all := utilfeature.DefaultMutableFeatureGate.GetAll()
	deps := dependencies()

	reason := map[featuregate.Feature]string{}
	var queue []featuregate.Feature
	for name := range all {
		if matches(name) {
			reason[name] = "DRA"
			queue = append(queue, name)
		}
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		for _, dep := range deps[name] {
			if _, ok := reason[dep]; !ok {
				reason[dep] = "needed by " + string(name)
				queue = append(queue, dep)
			}
		}
	}

	// Drop gates that cannot be turned on, then everything depending on them.
	blocked := map[featuregate.Feature]string{}
	for name := range reason {
		spec, ok := all[name]
		switch {
		case !ok:
			blocked[name] = "unknown"
		case spec.LockToDefault && !spec.Default:
			blocked[name] = "locked off"
		case spec.PreRelease == featuregate.Deprecated:
			blocked[name] = "deprecated"
		case exclude[name] != "":
			blocked[name] = exclude[name]
		}
	}
	for changed := true; changed; {
		changed = false
		for name := range reason {
			if _, ok := blocked[name]; ok {
				continue
			}
			for _, dep := range deps[name] {
				if _, ok := blocked[dep]; ok {
					blocked[name] = "depends on blocked " + string(dep)
					changed = true
					break
				}
			}
		}
	}

	var out []Gate
	for name, why := range reason {
		if _, ok := blocked[name]; ok {
			continue
		}
		spec := all[name]
		out = append(out, Gate{Name: string(name), Stage: string(spec.PreRelease), Default: spec.Default, Reason: why})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })

	// The registry must accept the combination.
	fg := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	m := map[string]bool{}
	for _, g := range out {
		m[g.Name] = true
	}
	if err := fg.SetFromMap(m); err != nil {
		return nil, fmt.Errorf("feature registry rejects the DRA gate set: %w", err)
	}
	if errs := fg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("feature registry rejects the DRA gate set: %v", errs)
	}
	return out, nil
}

// FlagValue renders gates as the value of --feature-gates.
func FlagValue(gs []Gate) string {
	parts := make([]string, 0, len(gs))
	for _, g := range gs {
		parts = append(parts, g.Name+"=true")
	}
	return strings.Join(parts, ",")
}

// RuntimeConfigValue renders RuntimeConfig as the value of --runtime-config.
func RuntimeConfigValue() string {
	parts := make([]string, 0, len(RuntimeConfig)+len(releaseRuntimeConfig))
	for _, gv := range append(RuntimeConfig, releaseRuntimeConfig...) {
		parts = append(parts, gv+"=true")
	}
	return strings.Join(parts, ",")
}
