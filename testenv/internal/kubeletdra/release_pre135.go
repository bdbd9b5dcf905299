//go:build k8spre1.35

package kubeletdra

import (
	"context"

	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// runPlugins: before 1.35 the plugin manager takes only a stop channel.
func runPlugins(ctx context.Context, pm pluginmanager.PluginManager, ready config.SourcesReady) {
	pm.Run(ready, ctx.Done())
}
