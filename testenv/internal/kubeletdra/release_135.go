//go:build !k8spre1.35

package kubeletdra

import (
	"context"

	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// runPlugins runs the kubelet's plugin manager until ctx ends (1.35 added the context).
func runPlugins(ctx context.Context, pm pluginmanager.PluginManager, ready config.SourcesReady) {
	pm.Run(ctx, ready, ctx.Done())
}
