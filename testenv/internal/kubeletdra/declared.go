//go:build !k8spre1.37

package kubeletdra

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-helpers/nodedeclaredfeatures"
	"k8s.io/component-helpers/nodedeclaredfeatures/features"

	"draplugin.test/testenv/internal/buildinfo"
)

// knownGates answers for the gates this process knows; any other is off.
type knownGates struct{}

func (knownGates) Enabled(key string) bool {
	gate := featuregate.Feature(key)
	if _, known := utilfeature.DefaultMutableFeatureGate.GetAll()[gate]; !known {
		return false
	}
	return utilfeature.DefaultFeatureGate.Enabled(gate)
}

// declareFeatures lists in Node.status.declaredFeatures what this kubelet supports, as the
// kubelet of the release does from its feature gates (the API server refuses, for example,
// ResourceSlices with node-allocatable resources for a node that does not declare them).
func declareFeatures(node *v1.Node) {
	if !(knownGates{}).Enabled("NodeDeclaredFeatures") {
		return
	}
	current, err := version.ParseGeneric(buildinfo.KubernetesVersion())
	if err != nil {
		return
	}
	framework := nodedeclaredfeatures.New(features.AllFeatures)
	node.Status.DeclaredFeatures = framework.DiscoverNodeFeatures(
		&nodedeclaredfeatures.NodeConfiguration{FeatureGates: knownGates{}, Version: current},
	)
}
