// Package testplugin is a minimal DRA kubelet plugin used to exercise the
// kubelet-dra harness: it publishes a few devices for its node, writes a
// CDI spec per claim on prepare and removes it on unprepare. Every gRPC call
// is appended to <plugin-dir>/calls.jsonl so tests can see what happened.
package testplugin

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type plugin struct {
	driver    string
	pool      string
	cdiDir    string
	callsFile string
	health    string
	devices   []string
	mu        sync.Mutex
}

// Main runs the "testplugin" subcommand.
func Main(args []string) error {
	fs := flag.NewFlagSet("testplugin", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (required)")
	driver := fs.String("driver-name", "test.dra.dev", "DRA driver name")
	node := fs.String("node-name", "", "node name (required)")
	registryDir := fs.String("registry-dir", "", "kubelet plugin registry directory (required)")
	pluginDir := fs.String("plugin-dir", "", "directory for the DRA socket; default <registry-dir>/../plugins/<driver>")
	cdiDir := fs.String("cdi-dir", "", "directory for CDI specs (required)")
	count := fs.Int("devices", 2, "number of devices to publish")
	healthFile := fs.String("health-file", "", "file listing unhealthy device names, one per line; enables health reports")
	numaNodes := fs.String("numa-nodes", "", "comma-separated NUMA node of each device, published as the standard resource.kubernetes.io/numaNode attribute")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" || *node == "" || *registryDir == "" || *cdiDir == "" {
		return errors.New("--kubeconfig, --node-name, --registry-dir and --cdi-dir are required")
	}
	if *pluginDir == "" {
		*pluginDir = filepath.Join(filepath.Dir(filepath.Clean(*registryDir)), "plugins", *driver)
	}
	for _, d := range []string{*pluginDir, *registryDir, *cdiDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	p := &plugin{
		driver:    *driver,
		pool:      *node,
		cdiDir:    *cdiDir,
		callsFile: filepath.Join(*pluginDir, "calls.jsonl"),
		health:    *healthFile,
	}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, fmt.Sprintf("dev-%d", i))
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	logger := klog.Background().WithName("testplugin")
	ctx = klog.NewContext(ctx, logger)

	opts, err := healthOptions(*healthFile)
	if err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, p, append([]kubeletplugin.Option{
		kubeletplugin.DriverName(*driver),
		kubeletplugin.NodeName(*node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
	}, opts...)...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	numa, err := parseNumaNodes(*numaNodes, len(p.devices))
	if err != nil {
		return err
	}
	var devs []resourceapi.Device
	for i, name := range p.devices {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"index": {IntValue: ptr.To(int64(i))},
			"model": {StringValue: ptr.To("testdev")},
		}
		if numa != nil {
			attrs["resource.kubernetes.io/numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To(numa[i])}
		}
		devs = append(devs, resourceapi.Device{Name: name, Attributes: attrs})
	}
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
	if err := helper.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish resources: %w", err)
	}
	logger.Info("testplugin running", "driver", *driver, "node", *node, "devices", p.devices)
	<-ctx.Done()
	return nil
}

// parseNumaNodes reads --numa-nodes: one NUMA node per device, or nothing.
func parseNumaNodes(text string, devices int) ([]int64, error) {
	if text == "" {
		return nil, nil
	}
	parts := strings.Split(text, ",")
	if len(parts) != devices {
		return nil, fmt.Errorf("--numa-nodes has %d entries for %d devices", len(parts), devices)
	}
	out := make([]int64, len(parts))
	for i, part := range parts {
		n, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--numa-nodes: %w", err)
		}
		out[i] = n
	}
	return out, nil
}

func (p *plugin) record(method string, fields map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fields["method"] = method
	fields["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	line, _ := json.Marshal(fields)
	f, err := os.OpenFile(p.callsFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	_, _ = f.Write(append(line, '\n'))
}

// cdiVendorClass splits the CDI kind "<driver>/claim".
func (p *plugin) cdiKind() string { return p.driver + "/claim" }

func (p *plugin) specPath(uid types.UID) string {
	return filepath.Join(p.cdiDir, fmt.Sprintf("%s-claim_%s.json", p.driver, uid))
}

type cdiSpec struct {
	CDIVersion string      `json:"cdiVersion"`
	Kind       string      `json:"kind"`
	Devices    []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string         `json:"name"`
	ContainerEdits map[string]any `json:"containerEdits"`
}

func (p *plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var spec = cdiSpec{CDIVersion: "0.6.0", Kind: p.cdiKind()}
		var devices []kubeletplugin.Device
		var names []string
		if claim.Status.Allocation == nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: errors.New("claim is not allocated")}
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != p.driver {
				continue
			}
			cdiName := fmt.Sprintf("%s-%s", claim.UID, r.Device)
			envName := "TESTPLUGIN_" + strings.ToUpper(strings.ReplaceAll(r.Device, "-", "_"))
			spec.Devices = append(spec.Devices, cdiDevice{
				Name: cdiName,
				ContainerEdits: map[string]any{
					"env": []string{envName + "=" + r.Device, "TESTPLUGIN_CLAIM=" + claim.Namespace + "/" + claim.Name},
					"deviceNodes": []map[string]any{{
						"path":     "/dev/testplugin-" + r.Device,
						"hostPath": "/dev/null",
					}},
				},
			})
			devices = append(devices, kubeletplugin.Device{
				Requests:     []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CDIDeviceIDs: []string{p.cdiKind() + "=" + cdiName},
			})
			names = append(names, r.Device)
		}
		data, err := json.MarshalIndent(spec, "", "  ")
		if err == nil {
			err = writeAtomic(p.specPath(claim.UID), data)
		}
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
		p.record("prepare", map[string]any{"claimUID": string(claim.UID), "namespace": claim.Namespace, "name": claim.Name, "devices": names})
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, claim := range claims {
		err := os.Remove(p.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[claim.UID] = err
		p.record("unprepare", map[string]any{"claimUID": string(claim.UID), "namespace": claim.Namespace, "name": claim.Name})
	}
	return out, nil
}

func (p *plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
