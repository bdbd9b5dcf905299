package kubeletdra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

var bootID = func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}()

// Event reasons, as the kubelet uses them.
const (
	reasonFailedPrepare   = "FailedPrepareDynamicResources"
	reasonFailedUnprepare = "FailedUnprepareDynamicResources"
	reasonFailedCDI       = "Failed"
	reasonStarted         = "Started"
)

// Queue keys: "<namespace>/<name>" for pods in the informer, "gone/<uid>"
// for pods that disappeared from the API without us finishing them.
const goneKeyPrefix = "gone/"

type podWorker struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
	manager  *dra.Manager
	nodeName string
	rootDir  string
	cdiDirs  []string
	cdiCache *cdi.Cache

	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	running map[types.UID]bool    // pods marked running by this process
	gone    map[types.UID]*v1.Pod // last known state of deleted pods
	ready   config.SourcesReady
	health  map[string]healthEntry // see writeHealth
}

func newPodWorker(client kubernetes.Interface, recorder record.EventRecorder, manager *dra.Manager, nodeName, rootDir string, cdiDirs []string) *podWorker {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	pw := &podWorker{
		client:   client,
		recorder: recorder,
		manager:  manager,
		nodeName: nodeName,
		rootDir:  rootDir,
		cdiDirs:  cdiDirs,
		factory:  factory,
		informer: factory.Core().V1().Pods().Informer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "kubelet-dra-pods"},
		),
		running: map[types.UID]bool{},
		gone:    map[types.UID]*v1.Pod{},
		health:  map[string]healthEntry{},
	}
	pw.ready = config.NewSourcesReady(func(_ sets.Set[string]) bool { return pw.informer.HasSynced() })
	return pw
}

func (pw *podWorker) sourcesReady() config.SourcesReady { return pw.ready }

// activePods is what the DRA manager's reconcile loop considers in use:
// every pod bound to this node that has not terminated.
func (pw *podWorker) activePods() []*v1.Pod {
	var out []*v1.Pod
	for _, obj := range pw.informer.GetStore().List() {
		pod := obj.(*v1.Pod)
		if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		out = append(out, pod)
	}
	return out
}

func (pw *podWorker) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	c, err := cdi.NewCache(cdi.WithSpecDirs(pw.cdiDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		// The cache reports spec errors here too; they are also visible
		// per injection, so keep going like a runtime would.
		logger.Info("CDI cache reported errors", "err", err)
	}
	pw.cdiCache = c

	_, err = pw.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pw.enqueue(obj) },
		UpdateFunc: func(_, obj any) { pw.enqueue(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			pod, ok := obj.(*v1.Pod)
			if !ok {
				return
			}
			pw.mu.Lock()
			pw.gone[pod.UID] = pod
			pw.mu.Unlock()
			pw.queue.Add(goneKeyPrefix + string(pod.UID))
		},
	})
	if err != nil {
		return err
	}
	pw.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pw.informer.HasSynced) {
		return ctx.Err()
	}
	pw.ready.AddSource("api")
	go pw.healthLoop(ctx)
	go func() {
		<-ctx.Done()
		pw.queue.ShutDown()
	}()
	for pw.processNext(ctx) {
	}
	return ctx.Err()
}

func (pw *podWorker) enqueue(obj any) {
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err == nil {
		pw.queue.Add(key)
	}
}

func (pw *podWorker) processNext(ctx context.Context) bool {
	key, quit := pw.queue.Get()
	if quit {
		return false
	}
	defer pw.queue.Done(key)
	err := pw.sync(ctx, key)
	if err == nil {
		pw.queue.Forget(key)
		return true
	}
	if ctx.Err() == nil {
		klog.FromContext(ctx).Info("Pod sync failed, will retry", "key", key, "err", err)
	}
	pw.queue.AddRateLimited(key)
	return true
}

func (pw *podWorker) sync(ctx context.Context, key string) error {
	if uid, ok := strings.CutPrefix(key, goneKeyPrefix); ok {
		return pw.syncGone(ctx, types.UID(uid))
	}
	obj, exists, err := pw.informer.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		return nil // the delete handler queued a "gone" key
	}
	pod := obj.(*v1.Pod).DeepCopy()
	if pod.DeletionTimestamp != nil {
		return pw.terminate(ctx, pod)
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil
	}
	pw.mu.Lock()
	done := pw.running[pod.UID]
	pw.mu.Unlock()
	if done {
		return nil
	}
	return pw.start(ctx, pod)
}

// start runs the kubelet's prepare path for a new pod, resolves the CDI
// devices of each container, writes the record and marks the pod running.
func (pw *podWorker) start(ctx context.Context, pod *v1.Pod) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", klog.KObj(pod), "podUID", pod.UID)
	ctx = klog.NewContext(ctx, logger)
	rec := podRecord{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name, Node: pw.nodeName, Containers: map[string]*containerRecord{}}

	if err := pw.manager.PrepareResources(ctx, pod); err != nil {
		rec.PrepareError = err.Error()
		rec.PrepareAttempts = pw.queue.NumRequeues(podKey(pod)) + 1
		pw.recorder.Eventf(pod, v1.EventTypeWarning, reasonFailedPrepare, "Failed to prepare dynamic resources: %v", err)
		if werr := pw.writeRecord(&rec); werr != nil {
			logger.Error(werr, "Writing pod record")
		}
		return err
	}

	if err := pw.cdiCache.Refresh(); err != nil {
		logger.V(2).Info("CDI refresh reported errors", "err", err)
	}
	var injectErr error
	containers := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range containers {
		c := &containers[i]
		cr := &containerRecord{CDIDevices: []string{}, Env: []string{}, DeviceNodes: []string{}, Mounts: []mountRecord{}, Hooks: []hookRecord{}}
		rec.Containers[c.Name] = cr
		info, err := pw.manager.GetResources(pod, c)
		if err != nil {
			cr.CDIError = err.Error()
			injectErr = errors.Join(injectErr, fmt.Errorf("container %s: %w", c.Name, err))
			continue
		}
		for _, d := range info.CDIDevices {
			cr.CDIDevices = append(cr.CDIDevices, d.Name)
		}
		if len(cr.CDIDevices) == 0 {
			continue
		}
		if err := pw.inject(cr); err != nil {
			cr.CDIError = err.Error()
			injectErr = errors.Join(injectErr, fmt.Errorf("container %s: %w", c.Name, err))
		}
	}
	if injectErr != nil {
		// A container runtime fails container creation in this case.
		pw.recorder.Eventf(pod, v1.EventTypeWarning, reasonFailedCDI, "Error: CDI device injection failed: %v", injectErr)
		if werr := pw.writeRecord(&rec); werr != nil {
			logger.Error(werr, "Writing pod record")
		}
		return injectErr
	}
	if err := pw.writeRecord(&rec); err != nil {
		return err
	}
	if err := pw.markRunning(ctx, pod); err != nil {
		return err
	}
	pw.mu.Lock()
	pw.running[pod.UID] = true
	pw.mu.Unlock()
	pw.recorder.Eventf(pod, v1.EventTypeNormal, reasonStarted, "Prepared %d ResourceClaim(s); containers marked running", len(pod.Spec.ResourceClaims))
	logger.Info("Pod started")
	return nil
}

// inject resolves CDI device IDs into an OCI spec the way containerd does
// (cdi.Cache.InjectDevices on the container's spec) and records the edits.
func (pw *podWorker) inject(cr *containerRecord) error {
	spec := &oci.Spec{
		Version: oci.Version,
		Process: &oci.Process{Env: []string{}},
		Linux:   &oci.Linux{},
	}
	if _, err := pw.cdiCache.InjectDevices(spec, cr.CDIDevices...); err != nil {
		return err
	}
	cr.Env = append(cr.Env, spec.Process.Env...)
	for _, d := range spec.Linux.Devices {
		cr.DeviceNodes = append(cr.DeviceNodes, d.Path)
	}
	for _, m := range spec.Mounts {
		cr.Mounts = append(cr.Mounts, mountRecord{HostPath: m.Source, ContainerPath: m.Destination, Type: m.Type, Options: m.Options})
	}
	if h := spec.Hooks; h != nil {
		for stage, hooks := range map[string][]oci.Hook{
			"prestart": h.Prestart, "createRuntime": h.CreateRuntime, "createContainer": h.CreateContainer,
			"startContainer": h.StartContainer, "poststart": h.Poststart, "poststop": h.Poststop,
		} {
			for _, hk := range hooks {
				cr.Hooks = append(cr.Hooks, hookRecord{HookName: stage, Path: hk.Path, Args: hk.Args, Env: hk.Env})
			}
		}
		sort.SliceStable(cr.Hooks, func(i, j int) bool { return cr.Hooks[i].HookName < cr.Hooks[j].HookName })
	}
	return nil
}

func (pw *podWorker) markRunning(ctx context.Context, pod *v1.Pod) error {
	now := metav1.Now()
	status := pod.Status.DeepCopy()
	status.Phase = v1.PodRunning
	status.HostIP = "127.0.0.1"
	status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	status.PodIP = "127.0.0.1"
	status.PodIPs = []v1.PodIP{{IP: "127.0.0.1"}}
	if status.StartTime == nil {
		status.StartTime = &now
	}
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(status, v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now})
	}
	status.InitContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		cs := v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "testenv://" + c.Image,
			ContainerID: fmt.Sprintf("testenv://%s/%s", pod.UID, c.Name), Ready: true,
			State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			// a sidecar keeps running
			cs.Started = ptr.To(true)
			cs.State = v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}
		}
		status.InitContainerStatuses = append(status.InitContainerStatuses, cs)
	}
	status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "testenv://" + c.Image,
			ContainerID: fmt.Sprintf("testenv://%s/%s", pod.UID, c.Name),
			Ready:       true, Started: ptr.To(true),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	if utilfeature.DefaultFeatureGate.Enabled(features.ResourceHealthStatus) {
		updateAllocatedResourcesStatus(ctx, pw.manager, pod, status)
	}
	pod.Status = *status
	_, err := pw.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

func setCondition(status *v1.PodStatus, cond v1.PodCondition) {
	for i := range status.Conditions {
		if status.Conditions[i].Type == cond.Type {
			if status.Conditions[i].Status == cond.Status {
				return
			}
			status.Conditions[i] = cond
			return
		}
	}
	status.Conditions = append(status.Conditions, cond)
}

// terminate runs the unprepare path for a pod being deleted, then finishes
// the deletion as the kubelet does once all containers are gone.
func (pw *podWorker) terminate(ctx context.Context, pod *v1.Pod) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", klog.KObj(pod), "podUID", pod.UID)
	ctx = klog.NewContext(ctx, logger)
	if err := pw.manager.UnprepareResources(ctx, pod); err != nil {
		pw.recorder.Eventf(pod, v1.EventTypeWarning, reasonFailedUnprepare, "Failed to unprepare dynamic resources: %v", err)
		return err
	}
	pw.removeRecord(pod.Namespace, pod.Name, pod.UID)
	pw.mu.Lock()
	delete(pw.running, pod.UID)
	pw.mu.Unlock()
	err := pw.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	logger.Info("Pod terminated")
	return nil
}

// syncGone unprepares a pod that vanished from the API server (for example
// force-deleted) and removes its record.
func (pw *podWorker) syncGone(ctx context.Context, uid types.UID) error {
	pw.mu.Lock()
	pod := pw.gone[uid]
	pw.mu.Unlock()
	if pod == nil {
		return nil
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", klog.KObj(pod), "podUID", pod.UID)
	if err := pw.manager.UnprepareResources(klog.NewContext(ctx, logger), pod); err != nil {
		return err
	}
	pw.removeRecord(pod.Namespace, pod.Name, pod.UID)
	pw.mu.Lock()
	delete(pw.gone, uid)
	delete(pw.running, uid)
	pw.mu.Unlock()
	logger.Info("Deleted pod cleaned up")
	return nil
}

func podKey(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

type podRecord struct {
	UID             string                      `json:"uid"`
	Namespace       string                      `json:"namespace"`
	Name            string                      `json:"name"`
	Node            string                      `json:"node"`
	PrepareError    string                      `json:"prepareError,omitempty"`
	PrepareAttempts int                         `json:"prepareAttempts,omitempty"`
	Containers      map[string]*containerRecord `json:"containers"`
	Updated         string                      `json:"updated"`
}

type containerRecord struct {
	CDIDevices  []string      `json:"cdiDevices"`
	Env         []string      `json:"env"`
	DeviceNodes []string      `json:"deviceNodes"`
	Mounts      []mountRecord `json:"mounts"`
	Hooks       []hookRecord  `json:"hooks"`
	CDIError    string        `json:"cdiError,omitempty"`
}

type mountRecord struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Type          string   `json:"type,omitempty"`
	Options       []string `json:"options,omitempty"`
}

type hookRecord struct {
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args,omitempty"`
	Env      []string `json:"env,omitempty"`
}

func (pw *podWorker) recordPath(namespace, name string) string {
	return filepath.Join(recordsDir(pw.rootDir), namespace+"_"+name+".json")
}

func (pw *podWorker) writeRecord(rec *podRecord) error {
	rec.Updated = time.Now().UTC().Format(time.RFC3339Nano)
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(pw.recordPath(rec.Namespace, rec.Name), data)
}

// removeRecord deletes the record if it still belongs to the pod uid (a new
// pod with the same name may already have written its own).
func (pw *podWorker) removeRecord(namespace, name string, uid types.UID) {
	path := pw.recordPath(namespace, name)
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var rec podRecord
	if json.Unmarshal(data, &rec) == nil && rec.UID != "" && rec.UID != string(uid) {
		return
	}
	_ = os.Remove(path)
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
