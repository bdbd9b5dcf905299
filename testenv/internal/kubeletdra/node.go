package kubeletdra

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"draplugin.test/testenv/internal/buildinfo"
)

// Taints the API server (TaintNodesByCondition admission) or the node
// lifecycle controller put on nodes that are not ready yet. Without the node
// lifecycle controller nobody else removes them.
var notReadyTaints = map[string]bool{
	v1.TaintNodeNotReady:    true,
	v1.TaintNodeUnreachable: true,
}

type nodeAgent struct {
	client       kubernetes.Interface
	name         string
	labels       map[string]string
	cpu          string
	memory       string
	pods         string
	leaseSeconds int32

	mu   sync.Mutex
	node *v1.Node
}

func (n *nodeAgent) get(context.Context) (*v1.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.node == nil {
		return nil, fmt.Errorf("node %s not registered yet", n.name)
	}
	return n.node.DeepCopy(), nil
}

func (n *nodeAgent) set(node *v1.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.node = node.DeepCopy()
}

func (n *nodeAgent) allLabels() map[string]string {
	l := map[string]string{
		v1.LabelHostname:   n.name,
		v1.LabelOSStable:   runtime.GOOS,
		v1.LabelArchStable: runtime.GOARCH,
	}
	maps.Copy(l, n.labels)
	return l
}

// register creates the Node (or adopts an existing one), sets its status to
// Ready and removes not-ready taints. It retries until ctx ends.
func (n *nodeAgent) register(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	backoff := 200 * time.Millisecond
	for {
		err := n.registerOnce(ctx)
		if err == nil {
			return nil
		}
		logger.Info("Node registration failed, retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (n *nodeAgent) registerOnce(ctx context.Context) error {
	nodes := n.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, n.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.allLabels()}}
		node, err = nodes.Create(ctx, node, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if err != nil {
			return err // retry: get the existing one next time
		}
	case err != nil:
		return err
	default:
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		maps.Copy(node.Labels, n.allLabels())
		if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	n.set(node)
	if err := n.updateStatus(ctx); err != nil {
		return err
	}
	return n.removeNotReadyTaints(ctx)
}

func (n *nodeAgent) capacity() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse(n.cpu),
		v1.ResourceMemory:           resource.MustParse(n.memory),
		v1.ResourcePods:             resource.MustParse(n.pods),
		v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
}

func (n *nodeAgent) updateStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		node.Status.Capacity = n.capacity()
		node.Status.Allocatable = n.capacity()
		declareFeatures(node)
		node.Status.Phase = v1.NodeRunning
		node.Status.Addresses = []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: v1.NodeHostName, Address: n.name},
		}
		node.Status.NodeInfo = v1.NodeSystemInfo{
			MachineID:               "testenv-" + n.name,
			SystemUUID:              "testenv-" + n.name,
			BootID:                  bootID,
			KernelVersion:           "testenv",
			OSImage:                 "testenv",
			ContainerRuntimeVersion: "testenv://" + buildinfo.KubernetesVersion(),
			KubeletVersion:          buildinfo.KubernetesVersion(),
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
		}
		conds := []v1.NodeCondition{
			{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet-dra is posting ready status"},
			{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
			{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure"},
			{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID"},
		}
		for i := range conds {
			conds[i].LastHeartbeatTime = now
			conds[i].LastTransitionTime = now
			for _, old := range node.Status.Conditions {
				if old.Type == conds[i].Type && old.Status == conds[i].Status {
					conds[i].LastTransitionTime = old.LastTransitionTime
				}
			}
		}
		node.Status.Conditions = conds
		updated, err := n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		n.set(updated)
		return nil
	})
}

func (n *nodeAgent) removeNotReadyTaints(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []v1.Taint
		for _, t := range node.Spec.Taints {
			if !notReadyTaints[t.Key] {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = keep
		updated, err := n.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		n.set(updated)
		return nil
	})
}

// heartbeat renews the node Lease every 10s and the Ready condition every
// 30s; if the Node was deleted it is registered again.
func (n *nodeAgent) heartbeat(ctx context.Context) {
	logger := klog.FromContext(ctx)
	lease := time.NewTicker(10 * time.Second)
	defer lease.Stop()
	status := time.NewTicker(30 * time.Second)
	defer status.Stop()
	n.renewLease(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-lease.C:
			n.renewLease(ctx)
		case <-status.C:
			_, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				err = n.registerOnce(ctx)
			} else if err == nil {
				err = n.updateStatus(ctx)
				if err == nil {
					err = n.removeNotReadyTaints(ctx)
				}
			}
			if err != nil {
				logger.Info("Node status heartbeat failed", "err", err)
			}
		}
	}
}

func (n *nodeAgent) renewLease(ctx context.Context) {
	logger := klog.FromContext(ctx)
	leases := n.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node, gerr := n.get(ctx)
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: v1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(n.name),
				LeaseDurationSeconds: ptr.To(n.leaseSeconds),
				RenewTime:            &now,
			},
		}
		if gerr == nil {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
	case err == nil:
		l.Spec.HolderIdentity = ptr.To(n.name)
		l.Spec.LeaseDurationSeconds = ptr.To(n.leaseSeconds)
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		logger.V(2).Info("Lease renewal failed", "err", err)
	}
}
