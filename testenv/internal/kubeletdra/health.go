package kubeletdra

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// healthEntry is the latest known health of one device used by one container.
type healthEntry struct {
	Namespace  string `json:"namespace"`
	Pod        string `json:"pod"`
	PodUID     string `json:"podUID"`
	Container  string `json:"container"`
	Resource   string `json:"resource"`   // "claim:<name>[/<request>]"
	ResourceID string `json:"resourceID"` // first CDI device ID, or driver/pool/device
	Health     string `json:"health"`     // Healthy, Unhealthy, Unknown
	Message    string `json:"message,omitempty"`
	Time       string `json:"time"`
}

// healthLoop consumes the DRA manager's resource-health notifications, puts
// the health into the pod status (allocatedResourcesStatus, as the kubelet
// does) and records it in <root-dir>/health.json.
func (pw *podWorker) healthLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case upd := <-pw.manager.Updates():
			for _, uid := range upd.PodUIDs {
				pod := pw.podByUID(types.UID(uid))
				if pod == nil {
					continue
				}
				if err := pw.updateHealth(ctx, pod); err != nil {
					logger.Info("Updating resource health failed", "pod", klog.KObj(pod), "err", err)
				}
			}
		}
	}
}

func (pw *podWorker) podByUID(uid types.UID) *v1.Pod {
	for _, obj := range pw.informer.GetStore().List() {
		if pod := obj.(*v1.Pod); pod.UID == uid {
			return pod.DeepCopy()
		}
	}
	return nil
}

func (pw *podWorker) updateHealth(ctx context.Context, pod *v1.Pod) error {
	var final *v1.Pod
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pw.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return nil
		}
		status := cur.Status.DeepCopy()
		updateAllocatedResourcesStatus(ctx, pw.manager, cur, status)
		cur.Status = *status
		final = cur
		if len(status.ContainerStatuses) == 0 {
			return nil // not running yet; status gets computed when it starts
		}
		_, err = pw.client.CoreV1().Pods(cur.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil || final == nil {
		return err
	}
	return pw.writeHealth(final)
}

func (pw *podWorker) writeHealth(pod *v1.Pod) error {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	pw.mu.Lock()
	defer pw.mu.Unlock()
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			for _, rh := range rs.Resources {
				e := healthEntry{
					Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID), Container: cs.Name,
					Resource: string(rs.Name), ResourceID: string(rh.ResourceID), Health: string(rh.Health), Time: now,
					Message: healthMessage(rh),
				}
				pw.health[pod.Namespace+"/"+pod.Name+"/"+cs.Name+"/"+e.Resource+"/"+e.ResourceID] = e
			}
		}
	}
	keys := make([]string, 0, len(pw.health))
	for k := range pw.health {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	entries := make([]healthEntry, 0, len(keys))
	for _, k := range keys {
		entries = append(entries, pw.health[k])
	}
	data, err := json.MarshalIndent(map[string]any{"updated": now, "entries": entries}, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(pw.rootDir, "health.json"), data)
}
