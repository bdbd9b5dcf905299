//go:build k8spre1.36

package kubeletdra

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// getNodeFunc: before 1.36 the DRA manager asks for the Node without a context.
func getNodeFunc(n *nodeAgent) dra.GetNodeFunc {
	return func() (*v1.Node, error) { return n.get(context.Background()) }
}

// healthMessage: before 1.36 a device's health carries no message.
func healthMessage(v1.ResourceHealth) string { return "" }
