//go:build !k8spre1.35

package gates

import (
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
)

// dependencies: which gates each gate needs, as the release's registry declares them.
func dependencies() map[featuregate.Feature][]featuregate.Feature {
	return utilfeature.DefaultFeatureGate.Dependencies()
}
