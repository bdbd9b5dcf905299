//go:build k8spre1.37

package kubeletdra

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// stopManager: before 1.37 the DRA manager has no Stop; its goroutines end with the
// context passed to Start, which is cancelled on the way out.
func stopManager(*dra.Manager) {}

// updateAllocatedResourcesStatus: before 1.37 the call takes no logger.
func updateAllocatedResourcesStatus(_ context.Context, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(pod, status)
}
