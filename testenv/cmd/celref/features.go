//go:build !k8spre1.36

package main

import "k8s.io/dynamic-resource-allocation/cel"

// celFeatures: the CEL environment's optional features (list-type attributes since 1.36).
func celFeatures(consumable, listAttrs bool) (cel.Features, error) {
	return cel.Features{EnableConsumableCapacity: consumable, EnableListTypeAttributes: listAttrs}, nil
}
