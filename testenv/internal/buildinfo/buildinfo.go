// Package buildinfo reports the Kubernetes release the binary was built from.
package buildinfo

import (
	"runtime/debug"
	"strings"

	"k8s.io/component-base/version"
)

// KubernetesVersion is the version of the k8s.io/kubernetes module linked
// into this binary (e.g. "v1.37.1"). It falls back to the version stamped
// with -ldflags when build information is unavailable.
func KubernetesVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				if dep.Replace != nil && dep.Replace.Version != "" {
					return dep.Replace.Version
				}
				return dep.Version
			}
		}
	}
	v := version.Get().GitVersion
	if strings.HasPrefix(v, "v0.0.0") {
		return "unknown"
	}
	return v
}
