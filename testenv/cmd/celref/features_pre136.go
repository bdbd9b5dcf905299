//go:build k8spre1.36

package main

import (
	"errors"

	"k8s.io/dynamic-resource-allocation/cel"
)

// celFeatures: before 1.36 the CEL environment has no list-type attributes.
func celFeatures(consumable, listAttrs bool) (cel.Features, error) {
	if listAttrs {
		return cel.Features{}, errors.New("--list-type-attributes needs Kubernetes 1.36 or later")
	}
	return cel.Features{EnableConsumableCapacity: consumable}, nil
}
