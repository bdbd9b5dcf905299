//go:build !k8spre1.36

package kubeletdra

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// getNodeFunc hands the node agent's Node to the DRA manager (1.36 added the context).
func getNodeFunc(n *nodeAgent) dra.GetNodeFunc { return n.get }

// healthMessage: the driver's message on a device's health (a field since 1.36).
func healthMessage(rh v1.ResourceHealth) string {
	if rh.Message != nil {
		return *rh.Message
	}
	return ""
}
