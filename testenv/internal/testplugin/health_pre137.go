//go:build k8spre1.37

package testplugin

import (
	"errors"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// healthOptions: k8s.io/dynamic-resource-allocation has no health service before 1.37,
// so health reports cannot be offered; asking for them is an error, not a silent no-op.
func healthOptions(file string) ([]kubeletplugin.Option, error) {
	if file != "" {
		return nil, errors.New("--health-file needs the kubeletplugin health service of Kubernetes 1.37 or later")
	}
	return nil, nil
}
