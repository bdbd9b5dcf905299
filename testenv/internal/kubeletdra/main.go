// Package kubeletdra runs the kubelet's own Dynamic Resource Allocation code
// for one node without a container runtime: the kubelet's plugin manager
// watches <root-dir>/plugins_registry, the kubelet's DRA manager prepares and
// unprepares ResourceClaims of the pods bound to the node, and CDI device IDs
// are resolved into an OCI spec with the container-device-interface library
// the way containerd does. What a container would have received is written to
// <root-dir>/pods/<namespace>_<name>.json.
package kubeletdra

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

type options struct {
	kubeconfig   string
	nodeName     string
	rootDir      string
	labels       stringList
	cdiDirs      stringList
	featureGates string
	cpu          string
	memory       string
	pods         string
	leaseSeconds int
}

// Main runs the "kubelet-dra" subcommand.
func Main(args []string) error {
	var o options
	fs := flag.NewFlagSet("kubelet-dra", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (required)")
	fs.StringVar(&o.nodeName, "node-name", "", "node name (required)")
	fs.StringVar(&o.rootDir, "root-dir", "", "kubelet root directory (required)")
	fs.Var(&o.labels, "node-label", "node label key=value (repeatable)")
	fs.Var(&o.cdiDirs, "cdi-dir", "CDI spec directory (repeatable, later ones win conflicts); default <root-dir>/cdi")
	fs.StringVar(&o.featureGates, "feature-gates", "", "feature gates, as for the kubelet")
	fs.StringVar(&o.cpu, "cpu", "8", "node cpu capacity")
	fs.StringVar(&o.memory, "memory", "32Gi", "node memory capacity")
	fs.StringVar(&o.pods, "pods", "110", "node pod capacity")
	fs.IntVar(&o.leaseSeconds, "node-lease-duration-seconds", 40, "node lease duration")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.kubeconfig == "" || o.nodeName == "" || o.rootDir == "" {
		return errors.New("--kubeconfig, --node-name and --root-dir are required")
	}
	if o.featureGates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(o.featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	labels := map[string]string{}
	for _, kv := range o.labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--node-label %q: want key=value", kv)
		}
		labels[k] = v
	}
	for _, q := range []string{o.cpu, o.memory, o.pods} {
		if _, err := resource.ParseQuantity(q); err != nil {
			return fmt.Errorf("capacity %q: %w", q, err)
		}
	}
	rootDir, err := filepath.Abs(o.rootDir)
	if err != nil {
		return err
	}
	o.rootDir = rootDir
	if len(o.cdiDirs) == 0 {
		o.cdiDirs = stringList{filepath.Join(rootDir, "cdi")}
	}
	for _, d := range append([]string{registryDir(rootDir), filepath.Join(rootDir, "plugins"), recordsDir(rootDir)}, o.cdiDirs...) {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	logger := klog.Background().WithName("kubelet-dra").WithValues("node", o.nodeName)
	ctx = klog.NewContext(ctx, logger)

	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = "kubelet-dra/" + o.nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: o.nodeName})

	nodes := &nodeAgent{client: client, name: o.nodeName, labels: labels, cpu: o.cpu, memory: o.memory, pods: o.pods, leaseSeconds: int32(o.leaseSeconds)}
	if err := nodes.register(ctx); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	go nodes.heartbeat(ctx)

	manager, err := dra.NewManager(logger, client, rootDir)
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	pw := newPodWorker(client, recorder, manager, o.nodeName, rootDir, o.cdiDirs)
	if err := manager.Start(ctx, pw.activePods, getNodeFunc(nodes), pw.sourcesReady()); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}
	defer stopManager(manager)

	plugins := pluginmanager.NewPluginManager(registryDir(rootDir), recorder)
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	go runPlugins(ctx, plugins, pw.sourcesReady())

	logger.Info("kubelet-dra running", "rootDir", rootDir, "registry", registryDir(rootDir), "cdiDirs", []string(o.cdiDirs))
	if err := pw.run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	logger.Info("kubelet-dra stopping")
	// Give in-flight status writes a moment; nothing else to flush.
	time.Sleep(100 * time.Millisecond)
	return nil
}

func registryDir(root string) string { return filepath.Join(root, "plugins_registry") }
func recordsDir(root string) string  { return filepath.Join(root, "pods") }
