//go:build !k8spre1.37

package kubeletdra

// The kubelet APIs this package calls changed between the releases in testenv/versions.
// Each difference is one small function: release_1N.go has the form of 1.N and later,
// release_pre1N.go the older one (build tag k8spre1.N, set by testenv/pin.sh --tags for
// a release older than 1.N).

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// stopManager stops the DRA manager's background work (1.37 added Manager.Stop).
func stopManager(m *dra.Manager) { m.Stop() }

// updateAllocatedResourcesStatus fills the pod's allocatedResourcesStatus from the
// drivers' health reports (1.37 added the logger argument).
func updateAllocatedResourcesStatus(ctx context.Context, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), pod, status)
}
